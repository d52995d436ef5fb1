"""How a rule hands a step its settings: the keys of its section, the other sections' values it borrows, the
values the rule derives (:func:`step_settings`), and a policy variant's overrides (:func:`variant_settings`).
:mod:`lara.config` re-exports these names; :mod:`lara.config.runs` builds every step's settings with them."""

from __future__ import annotations

import dataclasses
import functools
import json

from lara.config.schema import schema_node, section
from lara.settings import SECTIONS, ConfigError, settings_class

BASE_POLICIES = ("sft", "safe_rlhf", "safedpo")
TRAIN_SECTIONS = {"safe_rlhf": "train.safe_rlhf", "safedpo": "train.safedpo"}


def step_settings(config: dict, name: str, schema: dict, **derived) -> dict:
    """Everything a step's settings read, as a rule hands it over (``--settings``): the keys of its
    own section (``name`` is a section of lara.settings.SECTIONS, or a section-less step of STEPS),
    the values of other sections' keys that it names (``seed``, ``base_model.dtype``,
    ``calibration.tau``: the ``x-borrowed`` map generated from the dataclasses), and ``derived``
    values that the rule computes (a pool's seed, a calibration's Best-of-N size). The one way a
    rule builds a step's settings."""
    out = {}
    if name not in schema.get("x-steps", []):
        node = schema_node(schema, name)
        if "x-settings-keys" not in node:
            raise ConfigError(f"{name}: no step settings own this section (x-settings)")
        values = section(config, name)
        out = {k: _one(f"{name}.{k}", values[k]) for k in node["x-settings-keys"]}
    borrowed = schema.get("x-borrowed", {})
    for field, key in borrowed.get(name, {}).items():
        out[field] = _one(key, section(config, key))
    unknown = sorted(set(derived) - set(borrowed.get(name, {})) - set(out))
    if unknown:
        raise ConfigError(f"{name}: derived values {unknown} are not fields of its settings")
    return out | derived


@functools.cache
def several_keys() -> frozenset[str]:
    """The config keys that may list several values (a settings field with ``several=True``)."""
    return frozenset(f"{section_name}.{f.name}" for section_name in SECTIONS
                     for f in dataclasses.fields(settings_class(section_name)) if f.metadata.get("several"))


def _one(key: str, value):
    """The value a step reads of a key: the first of a listed ``several`` key (the rule derives the others)."""
    return value[0] if key in several_keys() and isinstance(value, list) else value


def settings_json(config: dict, name: str, schema: dict, **derived) -> str:
    """:func:`step_settings` as sorted JSON, so it changes exactly when a value the step reads does."""
    return json.dumps(step_settings(config, name, schema, **derived), sort_keys=True)


def variant_settings(config: dict, name: str, part: str) -> dict:
    """A policy's ``train`` or ``generation`` section: the config's, with a variant's overrides."""
    variant = config["decode"].get("policy_variants", {}).get(name)
    base = variant["base"] if variant else name
    dotted = "generation" if part == "generation" else TRAIN_SECTIONS[base]
    return {**section(config, dotted), **((variant or {}).get(part) or {})}
