"""The configuration's schema (``config/schema.yaml``, with the step settings' keys from ``settings.schema.yaml``)
and the paths into it and into a configuration: what :mod:`lara.config` and the modules it is made of
(:mod:`lara.config.layers`, :mod:`lara.config.refs`) share, importing nothing of them."""

from __future__ import annotations

import copy
import functools
from pathlib import Path

from lara.read.yamlfile import read_yaml
from lara.settings import ConfigError

# package data (installed with `pip install .`); config/schema.yaml in a checkout is a link to it
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schemas" / "schema.yaml"
SETTINGS_SCHEMA = "settings.schema.yaml"  # generated from the step settings (lara.settings), beside the schema


def load_schema(path: str | Path | None = None) -> dict:
    """The schema, with each ``x-settings: SECTION`` node given the keys of that section's step
    settings from ``settings.schema.yaml`` (generated from the dataclasses that own them)."""
    path = Path(path or SCHEMA_PATH)
    schema = _read_yaml(path)
    generated_path = path.parent / SETTINGS_SCHEMA
    generated = None
    for node in _nodes(schema):
        if "x-settings" not in node:
            continue
        if generated is None:
            generated = _read_yaml(generated_path)
        section = node["x-settings"]
        if section not in generated:
            raise ConfigError(f"{path}: x-settings {section!r} is not a section of {generated_path}")
        twice = sorted(set(node.get("properties", {})) & set(generated[section]["properties"]))
        if twice:
            raise ConfigError(f"{path}: {section} keys {twice} are owned by the step settings "
                              f"({generated_path.name}); remove them from the schema")
        node["properties"] = {**generated[section]["properties"], **node.get("properties", {})}
        node["x-settings-keys"] = list(generated[section]["properties"])
        if generated[section].get("required"):  # a step setting without a default (calibration.tau)
            node["required"] = sorted({*node.get("required", []), *generated[section]["required"]})
        node.setdefault("additionalProperties", False)
        node.setdefault("type", "object")
    schema["x-borrowed"] = (generated or {}).get("x-borrowed", {})
    schema["x-steps"] = (generated or {}).get("x-steps", [])
    return schema


def _read_yaml(path: Path) -> dict:
    """A schema file, parsed once per version of the file (its size and modification time), as a fresh copy."""
    stat = path.stat()
    return copy.deepcopy(_parsed(str(path.resolve()), stat.st_mtime_ns, stat.st_size))


@functools.cache
def _parsed(path: str, mtime_ns: int, size: int) -> dict:
    return read_yaml(path)


def _nodes(node):
    """Every mapping in a schema, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def _resolve(node: dict, root: dict) -> dict:
    """A schema node with a local ``$ref`` merged in (the node's own keys win)."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, root), **{k: v for k, v in node.items() if k != "$ref"}}


def schema_node(schema: dict, dotted: str) -> dict:
    """The schema node of the config key at a dotted path (``train.sft``), ``$ref``s followed on the way (the node
    itself as written)."""
    node = schema
    for part in dotted.split("."):
        node = _resolve(node, schema)["properties"][part]
    return node


def section(config: dict, dotted: str) -> dict:
    """The config section at a dotted path (``train.sft``)."""
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node
