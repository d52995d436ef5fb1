"""The layers a configuration is merged from (config files, ``extends:`` chains, Snakemake's ``--config``), the
experiment they name and the results folder it owns, and where each resolved value came from (``lara
validate-config --explain``, the settings table beside an experiment's results). :mod:`lara.config` validates what
they merge to, and re-exports these names."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

from lara.config.messages import origin_of
from lara.config.schema import _resolve, load_schema
from lara.data.errors import DataError
from lara.read.yamlfile import yaml_file
from lara.settings import SECTIONS, ConfigError, check_nesting, shown


def load_yaml(path: str | Path) -> dict:
    """A config file's mapping, or :class:`ConfigError` naming the file (and the line) in one line."""
    try:
        return yaml_file(path)
    except DataError as exc:
        raise ConfigError(str(exc)) from None


def merge(base: dict, override: dict) -> dict:
    """Recursive dict merge; ``override`` wins, mappings merge key by key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


EXTENDS = "extends"  # top-level key: the config file an experiment file builds on (relative to itself)


def _chain(path: Path, seen: tuple[Path, ...] = ()) -> list[tuple[str, dict]]:
    """A file's layers: the files it ``extends`` (recursively, first), then itself without that key."""
    data = load_yaml(path)
    base = data.pop(EXTENDS, None)
    if base is None:
        return [(str(path), data)]
    if not isinstance(base, str) or not base:
        raise ConfigError(f"{path}: {EXTENDS}: expected the path of a config file, got {base!r}")
    parent = (Path(path).parent / base).resolve()
    if parent in seen or parent == Path(path).resolve():
        raise ConfigError(f"{path}: {EXTENDS}: {base} extends itself (a cycle of {EXTENDS})")
    if not parent.is_file():
        raise ConfigError(f"{path}: {EXTENDS}: {base}: no such config file (read relative to {Path(path).parent})")
    return _chain(parent, (*seen, Path(path).resolve())) + [(str(path), data)]


def layers(*paths: str | Path, overrides: dict | None = None) -> list[tuple[str, dict]]:
    """The layers a configuration is merged from, in order, each ``(origin, mapping)``: a file that names an
    ``experiment`` is a whole experiment and starts from the step defaults, not from the files before it (to build on
    another file it names it in ``extends:``); a file without it is an overlay on the files before it; ``overrides``
    (Snakemake's ``--config``) come last. docs/configuration.md ("Layers, experiment names, and what is refused")
    says why, and what is refused (:class:`ConfigError`, naming the files) as it would change values without a word:
    an overlay given before a whole experiment, an experiment name two files name (:func:`check_experiment_names`),
    and a ``--config`` ``experiment`` that a file given names (the files' own name there changes nothing)."""
    out: list[tuple[str, dict]] = []
    overlays: list[str] = []  # the overlays on the current whole experiment
    dropped: list[tuple[str, dict]] = []  # the layers a whole experiment started afresh from
    for path in paths:
        chain = _chain(Path(path))
        if any("experiment" in data for _, data in chain):  # a whole experiment: the files before it do not count
            if overlays:
                raise ConfigError(f"{overlays[0]}: an overlay (a file without `experiment`) is given before {path}, "
                                  f"which names an experiment and so starts from the defaults: the overlay's values "
                                  f"would be dropped; give it after {path}")
            dropped, out = dropped + out, []
        else:
            overlays.append(str(path))
        out += chain
    if overrides:
        check_nesting(overrides, "--config")
        given = command_line_values(overrides)
        if "experiment" in given and given["experiment"] == experiment_layer(out)[1]:  # the files' own name: a no-op
            given = {k: v for k, v in given.items() if k != "experiment"}
        out.append(("--config", given))
    check_experiment_names(dropped + out, out)
    return out


def experiment_layer(layer_list: list[tuple[str, dict]]) -> tuple[str, object]:
    """The origin (a file, ``--config``) of the last layer that sets ``experiment``, and the experiment it names;
    ``("default", None)`` where none does (the schema's default)."""
    return next(((origin, data["experiment"]) for origin, data in reversed(layer_list) if "experiment" in data),
                ("default", None))


def _same_origin(a: str, b: str) -> bool:
    """Whether two layer origins are one: the same string, or two paths of the same file."""
    if a == b:
        return True
    if {a, b} & {"--config", "default", MODULE_CONFIG}:
        return False
    return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()


def _leaf_keys(data, prefix: str = "") -> set[str]:
    if isinstance(data, dict) and data:
        return {k for key, value in data.items() for k in _leaf_keys(value, f"{prefix}{key}.")}
    return {prefix.rstrip(".")}


def check_experiment_names(seen: list[tuple[str, dict]], kept: list[tuple[str, dict]]) -> None:
    """One experiment name, one config file (docs/configuration.md): of every layer given (``seen``, with those a
    whole experiment started afresh from), the ones that name the experiment the configuration (``kept``) resolves
    to must all be one file (a second one would start from the defaults and write them into the first one's results
    folder); so is ``--config`` renaming a configuration to it refused."""
    name = experiment_layer(kept)[1]
    owners = [origin for origin, data in seen if "experiment" in data and data["experiment"] == name]
    first = owners[0] if owners else None
    second = next((o for o in owners if not _same_origin(o, first)), None)
    if second is None:
        return
    if second == "--config":
        raise ConfigError(f"--config: experiment={shown(name)} is the experiment of {first} (its results are "
                          f"results/{shown(name)}/), and this configuration is not: give another name")
    index = next(i for i, (origin, _) in enumerate(seen) if origin == second)
    lost = len(_leaf_keys(merged(seen[:index])) - _leaf_keys(merged(kept)))
    lost_text = (f"; as a whole experiment it starts from the defaults, so {lost} values set before it would "
                 "silently change" if lost else "")
    raise ConfigError(f"{second}: experiment: {shown(name)!r} is already the experiment of {first}, and one "
                      f"experiment name is one config file (results/{shown(name)}/ are its results){lost_text}. To "
                      f"change some of its values, remove `experiment:` from {second} (a file without it is an "
                      f"overlay on the files before it); for a new experiment, give it another name (with an "
                      f"`{EXTENDS}:` naming {first} to build on it)")


def check_results(layer_list: list[tuple[str, dict]], name: str, results: Path = Path("results")) -> None:
    """Refuse, before any job is planned, a configuration that would write into another configuration's results:
    ``results/NAME/settings.tsv`` (written by every run) records which file named the experiment, and another
    file naming it now is refused, as is a name that differs from an existing results folder's only in case (one
    folder on macOS and Windows)."""
    owner = experiment_layer(layer_list)[0]
    if results.is_dir():
        clash = sorted(p.name for p in results.iterdir() if p.is_dir() and p.name != name
                       and p.name.lower() == name.lower())
        if clash:
            raise ConfigError(f"{owner}: experiment: {name!r} differs only in case from {results / clash[0]}/ (one "
                              "folder on macOS and Windows file systems): give a name that differs in more than case")
    table = results / name / "settings.tsv"
    recorded = _recorded_owner(table)
    if recorded is None or _same_origin(_plain_origin(recorded), _plain_origin(owner)):
        return
    what = ("--config" if owner == "--config" else "no config file (the default name)" if owner == "default"
            else owner)
    raise ConfigError(f"{what}: experiment: {name!r}: {results / name}/ holds the results of the configuration "
                      f"whose experiment {recorded} names ({table}), and this one would write into them: give "
                      f"this experiment another name, or make {owner} an overlay on {recorded} (remove its "
                      f"`experiment:`); if {recorded} was only moved or renamed, delete {table}")


def _plain_origin(origin: str) -> str:
    return "default" if origin == "default" or origin.endswith(" default") or " default (" in origin else origin


def _recorded_owner(table: Path) -> str | None:
    """The origin of ``experiment`` in a settings table (:func:`settings_table`), or None (no readable table)."""
    try:
        lines = table.read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines[1:]:
        key, _, rest = line.partition("\t")
        if key == "experiment":
            return rest.partition("\t")[2] or None
    return None


MODULE_CONFIG = "the config given to `module lara`"


def module_layers(given: dict, base: Path = Path(".")) -> list[tuple[str, dict]]:
    """The layers of a workflow used as a Snakemake module (``module lara: config: ...``): the mapping the caller
    gives is the experiment, one layer; its ``extends`` names a config file to build on (a paper config),
    read relative to the working directory, with that file's own ``extends`` chain."""
    check_nesting(given, MODULE_CONFIG)
    data = dict(given)
    parent = data.pop(EXTENDS, None)
    if parent is None:
        return [(MODULE_CONFIG, data)]
    if not isinstance(parent, str) or not (base / parent).is_file():
        raise ConfigError(f"{MODULE_CONFIG}: {EXTENDS}: {parent!r}: no such config file (read relative to "
                          f"{base.resolve()})")
    out = _chain(base / parent) + [(MODULE_CONFIG, data)]
    check_experiment_names(out, out)
    return out


_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")


def command_line_values(value):
    """Snakemake's ``--config`` typed as a YAML file would be. Snakemake reads a top-level value as a number
    or a boolean, but a nested one (``calibration={tau: -1.0}``) with YAML's base loader, which leaves every
    scalar a string: here each such string is read back as YAML 1.2 reads it (integers, decimals and
    exponents, true/false, null); any other string stays a string."""
    if isinstance(value, dict):
        return {k: command_line_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [command_line_values(v) for v in value]
    if not isinstance(value, str):
        return value
    if _INT.fullmatch(value):
        return int(value)
    if _FLOAT.fullmatch(value):
        return float(value)
    lowered = value.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "~"):
        return None
    return value


def merged(layer_list: list[tuple[str, dict]]) -> dict:
    config: dict = {}
    for _, data in layer_list:
        config = merge(config, data)
    return config


def explain(resolved: dict, layer_list: list[tuple[str, dict]], schema: dict | None = None) -> list[dict]:
    """Every resolved key (dotted; a list or a free-form mapping is one value) with its value and its
    origin: the last layer that sets it, else ``default``: the owning step's settings field
    (``step default (lara.train.ppo_lag:PPOLagSettings)``) or the schema's key default."""
    schema = schema or load_schema()
    rows = []

    def walk(node, sub_schema, path):
        sub_schema = _resolve(sub_schema or {}, schema)
        props = sub_schema.get("properties")
        extra = sub_schema.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else None
        if isinstance(node, dict) and node and (props is not None or extra is not None):
            for key, value in node.items():
                walk(value, (props or {}).get(key) or extra, [*path, key])
            return
        origin = origin_of(layer_list, path) or "default"
        if origin == "default":
            owner = SECTIONS.get(".".join(path[:-1]))  # the settings dataclass (module:Class) that owns the key
            origin = f"step default ({owner})" if owner else "schema default"
        rows.append({"key": ".".join(path), "value": node, "origin": origin})

    walk(resolved, schema, [])
    return rows


SETTINGS_TABLE_HEADER = "key\tvalue\torigin"
# where and how jobs run, never what they compute (changing them reruns nothing): not in the settings table
EXECUTION_SECTIONS = ("resources", "numerics")


def result_layers(layer_list: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The layers without the execution sections: what the settings table is made from (a layer left
    empty is dropped, so a file that sets only resources or numerics changes nothing the table shows)."""
    kept = [(origin, {k: v for k, v in data.items() if k not in EXECUTION_SECTIONS}) for origin, data in layer_list]
    return [(origin, data) for origin, data in kept if data]


def settings_table(rows: list[dict]) -> str:
    """The resolved settings that decide results, as a TSV (key, value as JSON, origin), written beside
    an experiment's results (``results/{exp}/settings.tsv``); every figure records its hash."""
    rows = [r for r in rows if r["key"].split(".")[0] not in EXECUTION_SECTIONS]
    return "\n".join([SETTINGS_TABLE_HEADER, *(f"{r['key']}\t{json.dumps(r['value'])}\t{r['origin']}"
                                                for r in rows)]) + "\n"


def explain_text(rows: list[dict]) -> str:
    """The ``--explain`` table: key, value (JSON), origin; one line each, aligned."""
    width = max((len(r["key"]) for r in rows), default=0)
    return "\n".join(f"{r['key']:<{width}}  {json.dumps(r['value'])}  [{r['origin']}]" for r in rows) + "\n"
