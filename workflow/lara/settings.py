"""The settings contract: each step's frozen settings dataclass owns its keys' defaults,
ranges and descriptions, once.

A field is declared with :func:`setting` (default, description, range); a dataclass that
inherits :class:`Settings` then

* checks its values when built (type, range, choices), naming the config key
  (``train.sft.learning_rate: -1 is not > 0``), so a ``lara`` command checks what the
  schema checks;
* is read by every step the same way: ``--settings JSON`` (a config section) plus one
  optional flag per key, generated from the fields (:func:`add_settings_arguments`, :func:`read_settings`);
* writes its config section's JSON schema (:func:`section_schema`):
  ``config/settings.schema.yaml`` is generated from the registry :data:`SECTIONS`
  (``lara settings-schema --write``), merged into ``config/schema.yaml`` by
  :func:`lara.config.load_schema`, and a test keeps the file equal to the dataclasses.

A field declared with ``key=`` (the seed, the weight dtype, tau for the audit) is not a key of
the section: it names the config key, owned by another section, that its value comes from
(:func:`seed_setting`, :func:`dtype_setting`). The one function that builds a step's settings
from the config (:func:`lara.config.step_settings`, which every rule calls) fills it, and the
same generated flag parses it (``--seed``), so no step defines a flag of its own for a config
value. Fields with ``config=False`` and no key are the step's own options (a batch size).
Steps without a config section of their own (the audit, the sweep, scoring) name their
settings class where they are registered (:data:`lara.steps.SECTIONLESS`; :data:`STEPS` here).
This module imports nothing heavy; the step modules are imported only to write the schema.

What the settings and the config files share is :mod:`lara.validation`'s, and callers import it from here
(:mod:`lara.config` imports this module, never the other way round): :class:`ConfigError`, the one validator
(:func:`strict_validator`) with its messages, and the reader of JSON settings (:func:`strict_json`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import types
import typing
from pathlib import Path
from typing import Any, Literal

from lara.steps import COMMANDS, SECTIONLESS
from lara.validation import (  # noqa: F401 (re-exported: callers import them from lara.settings)
    SHOWN_LENGTH,
    ConfigError,
    _strict_loads,
    check_nesting,
    dotted_key,
    error_message,
    listed,
    nesting_problem,
    nonfinite,
    schema_errors,
    shown,
    strict_json,
)

# config section -> "module:Class" of the step settings that own its keys (DAG order)
SECTIONS: dict[str, str] = {
    "toy": "lara.toy.world:ToyWorldSettings",
    "toy.model": "lara.toy.model:TinyLlamaSettings",
    "data.sft": "lara.data.ingest:IngestSettings",
    "data.preferences": "lara.data.ingest:PreferenceIngestSettings",
    "data.prompts": "lara.data.splits:SplitSettings",
    "data.value_prompts": "lara.data.value_prompts:ValuePromptSettings",
    "train.sft": "lara.train.common:SFTSettings",
    "train.reward": "lara.train.common:RewardSettings",
    "train.cost": "lara.train.common:CostSettings",
    "train.partial": "lara.train.common:PartialSettings",
    "train.value": "lara.train.common:ValueSettings",
    "train.safe_rlhf": "lara.train.ppo_lag:PPOLagSettings",
    "train.safedpo": "lara.train.safedpo:SafeDPOSettings",
    "generation": "lara.sample:GenerationSettings",
    "calibration": "lara.calibrate.calibrate:CalibrationSettings",
    "coverage": "lara.calibrate.coverage:CoverageSettings",
    "decode.rgtg.args": "lara.decode.rgtg:ARGSSettings",
    "decode.rgtg.pargs": "lara.decode.rgtg:PARGSSettings",
    "decode.rgtg.cdq": "lara.decode.rgtg:CDQSettings",
    "decode.bon_prune": "lara.calibrate.pruned:PruneSettings",
    "decode.budget": "lara.decode.budget:BudgetSettings",
    "evaluation": "lara.evaluate.evaluate:EvaluationSettings",
    "evaluation.judge": "lara.evaluate.judge:JudgeSettings",
    "figures": "lara.evaluate.figures:FigureSettings",
    "deployment": "lara.deploy.settings:DeploymentSettings",
    "deployment.prompts": "lara.deploy.settings:PoolSettings",
    "deployment.shift": "lara.deploy.shift:ShiftSettings",
    "realtext": "lara.realtext.pool:RealTextSettings",
}

# keys that were renamed: the old name is refused with a message naming the new one (three keys were once all
# called lambda_max, with three meanings)
RENAMED: dict[str, tuple[str, str]] = {
    "calibration.lambda_max": ("calibration.lambda_search_max", "the upper end of the calibration's search interval"),
    "decode.lambda_max": ("decode.overpenalised_lambda", "the lambda of the decoders' over-penalised `max` setting"),
    "train.safe_rlhf.lambda_max": ("train.safe_rlhf.lambda_clamp", "Safe-RLHF's upper clamp of its multiplier"),
    "train.safe_rlhf.threshold": ("calibration.tau", "the Safe-RLHF baseline is held to the budget LARA is held to, "
                                  "so Fig. 2 compares them at one budget", "remove the key"),
}


def renamed_message(key: str) -> str:
    new, what, *advice = RENAMED[key]
    return f"{key} is now {new} ({what}); {advice[0] if advice else 'rename the key'}"


# steps that read no config section of their own, only other sections' keys (their ``key=`` fields): the settings
# class of each, in its step's module, is registered with the step (lara.steps.SECTIONLESS)
STEPS: dict[str, str] = {name: f"{COMMANDS[name]}:{cls}" for name, cls in SECTIONLESS.items()}

SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "settings.schema.yaml"  # config/settings.schema.yaml

_MISSING = dataclasses.MISSING


def setting(default: Any = _MISSING, help: str = "", *, minimum: float | None = None,
            maximum: float | None = None, exclusive_minimum: float | None = None,
            exclusive_maximum: float | None = None, config: bool = True, bookkeeping: bool = False,
            key: str | None = None, url: bool = False, several: bool = False, length: int | None = None,
            env_name: bool = False) -> Any:
    """A settings field: its default, a one-line description, and its allowed range. ``several``: the
    config may list several values (each a run of the step, which reads one: the first unless its rule
    derives another; :func:`lara.config.step_settings`). ``bookkeeping``
    marks a key that changes how a run is logged or checkpointed, never its result (a checkpoint
    made under another value is still resumed). ``key``: the config key (another section's) that
    the value comes from; such a field is not a key of the step's own section. ``url``: a URL that must not
    carry credentials (``x-no-credentials``, checked by :func:`strict_validator`). ``length``: a list
    of exactly that many values (``[lo, hi]``). ``env_name``: the name of an environment variable, never a key
    itself (``x-env-name``)."""
    if not help:
        raise ValueError("every setting needs a description")
    if key is not None:
        config = False
        help = f"{help} (config key {key})"
    metadata = {"help": help, "config": config, "bookkeeping": bookkeeping, "key": key, "several": several,
                "length": length, "range": {
        k: v for k, v in (("minimum", minimum), ("maximum", maximum), ("exclusiveMinimum", exclusive_minimum),
                          ("exclusiveMaximum", exclusive_maximum)) if v is not None} | (
        {"x-no-credentials": True} if url else {}) | ({"x-env-name": True} if env_name else {})}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


# costs (and tau) smaller than this in magnitude sit within 1e6 of the calibration's 1e-12 tie resolution (a
# settings rule and a rule between sections compare tau with it, the calibration its costs)
COST_RESOLUTION = 1e-6
# the certified procedures of a Best-of-N calibration (lara.calibrate.certify), each a lambda setting decoded beside
# lambda* when calibration.cost_bounds are given: conformal risk control, Learn then Test with Hoeffding-Bentkus
# p-values, and Learn then Test with betting p-values (Waudby-Smith & Ramdas)
CERTIFIED = ("crc", "ltt", "ltt_wsr")
WEIGHTED = ("crc", "ltt")  # those with a covariate-shift weighted version (lara.calibrate.certify)

# the largest seed: every library's generator takes it, with room for the streams derived from it (seed + 1);
# numpy's legacy seeding and torch's CUDA generators stop at 2**32 - 1
SEED_MAX = 2**31 - 1

Dtype = Literal["float32", "bfloat16", "float16"]


def seed_setting() -> Any:
    """The experiment seed, as a field of every step that draws random numbers."""
    return setting(0, "The experiment seed; every stochastic step derives its own streams from it.", minimum=0,
                   maximum=SEED_MAX, key="seed")


def dtype_setting() -> Any:
    """The weight dtype, as a field of every step that loads a model."""
    return setting("float32", "Weight dtype of the models this step loads.", key="base_model.dtype")


def new_default(base, name: str, default: Any) -> Any:
    """A field of ``base`` redeclared in a subclass with another default (same description and range)."""
    return dataclasses.field(default=default, metadata=base.__dataclass_fields__[name].metadata)


def _type_schema(tp) -> dict:
    """JSON schema of a field's annotation: int, float, str, bool, Literal[...], list[...], X | None."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        sub = _type_schema(inner[0])
        if "enum" in sub:
            return {"enum": [*sub["enum"], None]}
        return {**sub, "type": [sub["type"], "null"]}
    if origin is Literal:
        return {"enum": list(args)}
    if origin is list:
        return {"type": "array", "items": _type_schema(args[0])}
    return {"type": {int: "integer", float: "number", str: "string", bool: "boolean"}[tp]}


@dataclasses.dataclass(frozen=True)
class CrossKey:
    """A rule between a step's settings values (several keys, or one key against a fixed limit that its schema
    cannot state): the config keys it reads, and a witness, a config overlay on config/config.yaml that breaks
    it (tests/unit/test_config_judged.py checks that :func:`lara.config.validate` refuses every witness with the
    rule's message)."""

    keys: tuple[str, ...]
    witness: dict


def cross_key(*keys: str, witness: dict):
    """Mark a method of a :class:`Settings` class as one of its cross-key rules: it returns the problem (a line
    that starts with the config key) or None. The settings' only refusals are their schema and these rules, run
    whenever the settings are built: by the step, and by :func:`lara.config.validate`, which builds every step's
    settings as the rules hand them over before any job (:mod:`lara.config.runs`)."""
    def mark(method):
        method.cross_key = CrossKey(tuple(keys), witness)
        return method
    return mark


def ordered_bounds(bounds, key: str) -> str | None:
    """The problem of a ``[lo, hi]`` that is not ``lo < hi`` (None: fine, or no bounds)."""
    if bounds is not None and not bounds[0] < bounds[1]:
        return f"{key}: {list(bounds)} is not [lo, hi] with lo < hi"
    return None


class Settings:
    """Base of the frozen step settings dataclasses (see the module docstring)."""

    SECTION: typing.ClassVar[str] = ""  # the config section, for messages ("train.sft")

    def __post_init__(self):
        """Check every field against its schema with the validator the config goes through
        (lara.config), so a step refuses exactly what the schema refuses, naming the key; then the class's
        cross-key rules (:func:`cross_key`). No settings class refuses anything else when built."""
        cls = type(self)
        schema = {"type": "object", "properties": _field_schemas(cls)}
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        problems = [f"{cls.named(str(e.absolute_path[0]))}: {error_message(e)}" for e in schema_errors(values, schema)]
        if not problems:
            problems = [p for rule in cls.cross_key_rules() if (p := rule(self))]
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

    @classmethod
    def named(cls, field: str) -> str:
        """A field as messages name it: its config key, and the field too where the key ends otherwise (Best-of-k's
        ``k`` is filled from decode.bon_n)."""
        key = cls.key(field)
        return key if key.rsplit(".", 1)[-1] == field else f"{field} ({key})"

    @classmethod
    def cross_key_rules(cls) -> list:
        """The class's cross-key rules (methods marked with :func:`cross_key`), in name order."""
        return [getattr(cls, name) for name in sorted(dir(cls))
                if callable(getattr(cls, name, None)) and hasattr(getattr(cls, name), "cross_key")]

    @classmethod
    def key(cls, name: str) -> str:
        """The config key of a field, for messages: its own section's, or the other section's it names."""
        field = getattr(cls, "__dataclass_fields__", {}).get(name)
        if field is not None and field.metadata.get("key"):
            return field.metadata["key"]
        return f"{cls.SECTION}.{name}" if cls.SECTION else name

    @classmethod
    def config_keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.metadata.get("config", True)]

    @classmethod
    def borrowed(cls) -> dict[str, str]:
        """The fields whose values come from other sections' config keys: field name -> dotted key."""
        return {f.name: f.metadata["key"] for f in dataclasses.fields(cls) if f.metadata.get("key")}

    @classmethod
    def from_mapping(cls, data: dict, origin: str = "--settings", **others):
        """The settings from a config section (``data``) plus the values that come from elsewhere."""
        if not isinstance(data, dict):
            raise ConfigError(f"{origin}: expected a mapping of {cls.SECTION or cls.__name__} settings")
        unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
        old = [renamed_message(cls.key(k)) for k in unknown if cls.key(k) in RENAMED]
        if old:
            raise ConfigError(f"{origin}: " + "; ".join(old))
        if unknown:
            raise ConfigError(f"{origin}: unknown key {listed(cls.key(shown(k)) for k in unknown)} "
                              f"(known: {', '.join(cls.config_keys() + list(cls.borrowed()))})")
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and f.name not in others
                   and f.default is _MISSING and f.default_factory is _MISSING]
        if missing:
            raise ConfigError(f"{origin}: missing {', '.join(cls.key(k) for k in missing)}")
        return cls(**data, **others)

    @classmethod
    def from_json(cls, text: str, origin: str = "--settings", **others):
        return cls.from_mapping(strict_json(text, origin) if text else {}, origin, **others)

    def result_settings(self) -> dict:
        """Every field that can change a run's result (all but the bookkeeping ones)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if not f.metadata.get("bookkeeping")}

    def section(self) -> dict:
        """The config section these settings stand for (the keys of the config, not the flags)."""
        return {k: getattr(self, k) for k in self.config_keys()}

    def to_json(self) -> str:
        """What a rule hands the step as ``--settings``: the section's keys and the other sections' values."""
        return json.dumps(self.section() | {k: getattr(self, k) for k in self.borrowed()}, sort_keys=True)


@typing.no_type_check
def _field_schemas(cls) -> dict[str, dict]:
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        schema = _type_schema(hints[f.name]) | f.metadata.get("range", {})
        if "items" in schema:
            schema["items"] |= f.metadata.get("range", {})
            for k in f.metadata.get("range", {}):
                schema.pop(k)
        if f.metadata.get("length"):  # a list of exactly this many values (e.g. [lo, hi])
            schema |= {"minItems": f.metadata["length"], "maxItems": f.metadata["length"]}
        out[f.name] = schema
    return out


def section_schema(cls) -> dict:
    """The JSON schema of ``cls``'s config section: every config key with its type, range,
    default and description."""
    schemas = _field_schemas(cls)
    props = {}
    for f in dataclasses.fields(cls):
        if not f.metadata.get("config", True):
            continue
        prop = dict(schemas[f.name])
        if f.metadata.get("several"):
            kind = prop.get("type", "value")
            prop = {"anyOf": [prop, {"type": "array", "items": dict(prop), "minItems": 1, "uniqueItems": True}],
                    "x-hint": f"one {kind}, or a list of distinct ones"}
        if f.default is not _MISSING:
            prop["default"] = f.default
        elif f.default_factory is not _MISSING:
            prop["default"] = f.default_factory()
        prop["description"] = f.metadata["help"]
        props[f.name] = prop
    required = [f.name for f in dataclasses.fields(cls) if f.metadata.get("config", True)
                and f.default is _MISSING and f.default_factory is _MISSING]
    return {"type": "object", "additionalProperties": False, "properties": props} | (
        {"required": required} if required else {})


def settings_class(section: str):
    """The settings dataclass of a config section (:data:`SECTIONS`) or a section-less step (:data:`STEPS`)."""
    module, _, name = {**SECTIONS, **STEPS}[section].partition(":")
    return getattr(importlib.import_module(module), name)


def generated_schema() -> dict:
    """Every registered section's schema, keyed by section, and (``x-borrowed``) for every section and
    section-less step, the other sections' keys that its settings read: field -> dotted config key."""
    out = {section: section_schema(settings_class(section)) for section in SECTIONS}
    borrowed = {name: settings_class(name).borrowed() for name in [*SECTIONS, *STEPS]}
    return out | {"x-steps": list(STEPS), "x-borrowed": {name: b for name, b in borrowed.items() if b}}


def render_schema_file() -> str:
    import yaml

    header = ("# GENERATED by `lara settings-schema --write` from the step settings dataclasses\n"
              "# (lara.settings.SECTIONS); do not edit. Each section's keys, types, ranges,\n"
              "# defaults and descriptions; config/schema.yaml merges them in (x-settings).\n")
    return header + yaml.safe_dump(generated_schema(), sort_keys=False, default_flow_style=None, width=1000)


# ---------------------------------------------------------------------------------------------
# one reader for every step: --settings JSON plus a flag per key


def add_settings_arguments(parser: argparse.ArgumentParser, cls, *, section_help: str | None = None) -> None:
    """``--settings JSON`` (the config section plus the values of other sections' keys that the
    step reads, as :func:`lara.config.step_settings` builds it) and ``--NAME VALUE`` for each of
    those fields (a flag given on the command line wins over the JSON)."""
    parser.add_argument("--settings", default="{}",
                        help=section_help or f"JSON of {cls.SECTION or cls.__name__}'s settings (keys below)")
    schemas = _field_schemas(cls)
    own = parser.add_argument_group(f"{cls.SECTION or cls.__name__} settings (override --settings)")
    other = parser.add_argument_group("values of other sections' config keys (override --settings)")
    for f in dataclasses.fields(cls):
        if not (f.metadata.get("config", True) or f.metadata.get("key")):
            continue
        default = f.default if f.default is not _MISSING else "required"
        group = own if f.metadata.get("config", True) else other
        group.add_argument(f"--{f.name.replace('_', '-')}", dest=f"setting_{f.name}", default=argparse.SUPPRESS,
                           type=_parser_of(schemas[f.name]), metavar="V",
                           help=f"{f.metadata['help']} (default {default})")


def _parser_of(schema: dict):
    """argparse type of a field: its plain type, ``null`` for None where allowed, JSON for lists."""
    kinds = schema.get("type", [])
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "enum" in schema:
        kinds = sorted({{str: "string", int: "integer", float: "number"}.get(type(e), "null") for e in schema["enum"]})
    plain = {"integer": int, "number": float, "string": str}
    base = next((plain[k] for k in kinds if k in plain), None)
    if base is None:  # booleans and lists: JSON (true, false, [1, 2])
        def parse_json(text: str):
            try:
                return _strict_loads(text, "the value")
            except json.JSONDecodeError:
                cut = "..." if len(text) > SHOWN_LENGTH else ""
                raise argparse.ArgumentTypeError(f"not JSON: {text[:SHOWN_LENGTH]!r}{cut} (a list is written "
                                                 "[0, 0.5, 1], a boolean true or false)") from None
            except ConfigError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None

        parse_json.__name__ = "JSON"
        return parse_json

    def parse(text: str):
        return None if "null" in kinds and text in ("null", "None") else base(text)

    parse.__name__ = base.__name__  # argparse names the type in its error message
    return parse


def read_settings(args: argparse.Namespace, cls, **others):
    """The settings of a step from its parsed arguments (see :func:`add_settings_arguments`)."""
    data = strict_json(args.settings, "--settings") if args.settings else {}
    if not isinstance(data, dict):
        raise ConfigError("--settings: expected a JSON object")
    for name in [*cls.config_keys(), *cls.borrowed()]:
        if hasattr(args, f"setting_{name}"):  # given on the command line (null included)
            data[name] = getattr(args, f"setting_{name}")
    both = sorted(set(data) & set(others))
    if both:
        raise ConfigError(f"--settings: {both[0]!r} is given by its own flag (--{both[0].replace('_', '-')}), not in "
                          "--settings")
    settings = cls.from_mapping(data, "--settings", **others)
    after = getattr(args, "_after_settings", None)
    if after is not None:  # lara.cli: the settings first, then every input through the one reader
        after(args)
    return settings


# ---------------------------------------------------------------------------------------------
# CLI: lara settings-schema

HELP = "print (or --write, or --check) config/settings.schema.yaml, generated from the step settings"


def add_arguments(parser) -> None:
    parser.add_argument("--write", action="store_true", help=f"write {SCHEMA_FILE.name}")
    parser.add_argument("--check", action="store_true", help=f"fail if {SCHEMA_FILE.name} is out of date")


def run(args) -> None:
    text = render_schema_file()
    if args.write:
        SCHEMA_FILE.write_text(text)
    elif args.check:
        if not SCHEMA_FILE.is_file() or SCHEMA_FILE.read_text() != text:
            raise ConfigError(f"{SCHEMA_FILE}: out of date with the settings dataclasses; "
                              "run `lara settings-schema --write`")
    else:
        print(text, end="")
