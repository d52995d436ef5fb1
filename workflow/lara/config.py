"""Experiment configuration: load, merge, fill defaults from the schema, validate.

The schema (``config/schema.yaml``) gives every key a description and a default. An
unknown key, a wrong type or an out-of-range value fails with a message that names
the key as a dotted path (``calibration.bootstrap: -1 is less than the minimum of 1``).
The Snakefile calls :func:`validate` before any job is scheduled.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from pathlib import Path

import yaml

# what the settings and the config share lives in lara.settings (which imports nothing of lara.config); the names
# are lara.config's too, where every caller has imported them from
from lara.settings import (  # noqa: F401 (re-exported)
    RENAMED,
    SECTIONS,
    ConfigError,
    check_nesting,
    dotted_key,
    error_message,
    listed,
    nesting_problem,
    nonfinite,
    renamed_message,
    schema_errors,
    settings_class,
    shown,
    strict_json,
    strict_validator,
)

# package data (installed with `pip install .`); config/schema.yaml in a checkout is a link to it
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "schema.yaml"
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
    with open(path) as fh:
        return strict_yaml(fh)


def _nodes(node):
    """Every mapping in a schema, depth first."""
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list):
        for value in node:
            yield from _nodes(value)


def section(config: dict, dotted: str) -> dict:
    """The config section at a dotted path (``train.sft``)."""
    node = config
    for part in dotted.split("."):
        node = node[part]
    return node


def step_settings(config: dict, name: str, schema: dict, **derived) -> dict:
    """Everything a step's settings read, as a rule hands it over (``--settings``): the keys of its
    own section (``name`` is a section of lara.settings.SECTIONS, or a section-less step of STEPS),
    the values of other sections' keys that it names (``seed``, ``base_model.dtype``,
    ``calibration.tau``: the ``x-borrowed`` map generated from the dataclasses), and ``derived``
    values that the rule computes (a pool's seed, a calibration's Best-of-N size). The one way a
    rule builds a step's settings."""
    out = {}
    if name not in schema.get("x-steps", []):
        node = schema
        for part in name.split("."):
            node = _resolve(node, schema)["properties"][part]
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


def scenarios(config: dict) -> dict[str, dict]:
    """deployment.scenarios by name (each its schedule without the name); a name given twice is refused."""
    out: dict[str, dict] = {}
    for item in config["deployment"]["scenarios"]:
        name = item["name"]
        if name in out:
            raise ConfigError(f"deployment.scenarios: the name {name!r} is given twice (each scenario is its own "
                              "results folder)")
        out[name] = {k: v for k, v in item.items() if k != "name"}
    return out


def constraints(config: dict) -> list:
    """calibration.constraints parsed and checked (lara.constraints.spec): [] when none is listed."""
    from lara.constraints.spec import parse

    return parse(config["calibration"].get("constraints") or [])


def taus(config: dict) -> list[float]:
    """calibration.tau as a list: the main tau first (Safe-RLHF's budget, the audit's headline), then the others."""
    tau = config["calibration"]["tau"]
    return [float(t) for t in (tau if isinstance(tau, list) else [tau])]


def settings_json(config: dict, name: str, schema: dict, **derived) -> str:
    """:func:`step_settings` as sorted JSON, so it changes exactly when a value the step reads does."""
    return json.dumps(step_settings(config, name, schema, **derived), sort_keys=True)


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""


def _no_duplicates(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            given = key in seen
        except TypeError:  # an unhashable key (``? [a, b]``): construct_mapping refuses it, naming its line
            continue
        if given:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {shown(key)!r} is given twice in one mapping (lines {seen[key].line + 1} and "
                f"{key_node.start_mark.line + 1}); the second would silently replace the first",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)

MERGE_TAG = "tag:yaml.org,2002:merge"


class YAMLRefused(yaml.YAMLError):
    """YAML that parses, but that a configuration does not take: a merge key, nesting or aliases beyond any
    configuration (lara.settings.MAX_DEPTH, MAX_VALUES), an alias inside its own anchor. ``line``: 1-based."""

    def __init__(self, problem: str, line: int | None):
        super().__init__(problem)
        self.problem, self.line = problem, line

    def __str__(self) -> str:
        return f"line {self.line}: {self.problem}" if self.line else self.problem


def _node_children(node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_nodes(root) -> None:
    """Refuse, before anything is built from it (:class:`YAMLRefused`, naming the line), a document that
    nests or expands beyond any configuration or contains itself (:func:`lara.settings.nesting_problem`), or
    that uses a merge key (``<<: *anchor``): YAML 1.1 only, and a key written beside it silently replaces
    the merged one, which is what a key given twice does."""
    found = nesting_problem(root, _node_children)
    if found:
        problem, node = found
        raise YAMLRefused(problem, node.start_mark.line + 1)
    seen, todo = set(), [root]
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for key, _ in node.value:
                if key.tag == MERGE_TAG:
                    raise YAMLRefused("a YAML merge key (<<) is not read: it is YAML 1.1 only, and a key beside it "
                                      "silently replaces the merged one; write the keys out (an alias *name for a "
                                      "whole value is fine), or build on another config file with `extends:`",
                                      key.start_mark.line + 1)
        todo += _node_children(node)


def strict_yaml(stream):
    """``yaml.safe_load``, refusing duplicate keys, merge keys, and nesting or aliases beyond any configuration
    (:func:`_check_nodes`)."""
    loader = _StrictLoader(stream)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLRefused("nested too deeply to read (a configuration is a few levels deep)", None) from None
        if node is None:
            return None
        _check_nodes(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error on one line: what is wrong, then where (PyYAML's own text spans several, with a snippet)."""
    if isinstance(exc, yaml.MarkedYAMLError):
        what = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        mark = exc.problem_mark or exc.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        return " ".join(f"{what}{where}".split())
    return " ".join(str(exc).split())


def load_yaml(path: str | Path) -> dict:
    """A config file's mapping, or :class:`ConfigError` naming the file (and the line) in one line."""
    try:
        with open(path) as fh:
            data = strict_yaml(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except YAMLRefused as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    return data


def merge(base: dict, override: dict) -> dict:
    """Recursive dict merge; ``override`` wins, mappings merge key by key."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def defaults(schema: dict) -> dict:
    """The configuration made of the schema's defaults alone."""
    return _fill({}, schema, schema)


def _resolve(node: dict, root: dict) -> dict:
    """A schema node with a local ``$ref`` merged in (the node's own keys win)."""
    ref = node.get("$ref")
    if not ref:
        return node
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(target, root), **{k: v for k, v in node.items() if k != "$ref"}}


def _fill(instance, schema: dict, root: dict):
    """Fill defaults key by key: a missing key takes its default; a given mapping whose
    schema default is a mapping keeps its own keys and takes the rest from that default."""
    schema = _resolve(schema, root)
    if schema.get("type") != "object" or not isinstance(instance, dict):
        return instance
    out = dict(instance)
    for key, sub in schema.get("properties", {}).items():
        default = sub.get("default")
        if key not in out and "default" in sub:
            out[key] = copy.deepcopy(default)
        elif isinstance(out.get(key), dict) and isinstance(default, dict):
            out[key] = merge(default, out[key])
        if key in out:
            out[key] = _fill(out[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        for key in out:
            if key not in schema.get("properties", {}):
                out[key] = _fill(out[key], extra, root)
    return out


def _describe(error) -> str:
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - known, key=str)
        keys = listed(dotted_key([*error.absolute_path, k]) for k in unknown)
        hint = f" (known keys here: {', '.join(sorted(known))})" if known else ""
        return f"unknown key {keys}{hint}"
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        what = {"tau": "every experiment states its cost budget (E[c] <= tau, in the cost model's units)"}
        return "; ".join(f"{dotted_key([*error.absolute_path, k])}: missing; {what.get(k, 'it has no default')}"
                         for k in missing)
    return f"{dotted_key(error.absolute_path)}: {error_message(error)}"


def validate(config: dict, schema: dict | None = None, source: str = "config") -> dict:
    """Return ``config`` with defaults filled in, or raise :class:`ConfigError` naming every
    offending key."""
    old = [renamed_message(k) for k in RENAMED if _has_key(config, k)]
    if old:
        lines = "\n".join(f"  - {p}" for p in old)
        raise ConfigError(f"{source}: invalid configuration:\n{lines}")
    schema = schema or load_schema()
    filled = _fill(copy.deepcopy(config), schema, schema)
    problems = ([_describe(e) for e in schema_errors(filled, schema)]
                or [f"{k}: not a finite number (NaN and infinities are refused)" for k in nonfinite(filled)]
                or _cross_checks(filled) or check_policies(filled, schema))
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"{source}: invalid configuration:\n{lines}")
    return filled


def _has_key(config: dict, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _cross_checks(config: dict) -> list[str]:
    """Constraints between keys that a JSON Schema cannot state."""
    problems = []
    cal, dec = config.get("calibration", {}), config.get("decode", {})
    if cal.get("mode") == "bon" and dec.get("bon_n", 0) > cal.get("samples_per_prompt", 0):
        problems.append(f"decode.bon_n: Best-of-N with N = {dec['bon_n']} is calibrated (calibration.mode: bon) on "
                        f"calibration.samples_per_prompt = K = {cal['samples_per_prompt']} samples per prompt; "
                        f"N must be <= K")
    too_big = [n for n in dec.get("sweep_n", []) if n > dec.get("bon_n", 0)]
    if too_big:
        problems.append(f"decode.sweep_n: {too_big} exceed decode.bon_n = {dec['bon_n']} "
                        "(the candidates per test prompt)")
    try:
        found = constraints(config)
    except ConfigError as exc:
        problems.append(str(exc))
    else:
        if len(found) > 1 and cal.get("guarantee") == "crc":
            problems.append("calibration.guarantee: crc bounds one risk; with several calibration.constraints use "
                            "bootstrap or ltt (ltt holds every constraint at once)")
    return problems + _launch_checks(config)


LAUNCH_KEYS = ("processes", "accelerate_config")  # resources keys that say how a job starts, not what it gets


def launch_plan(res: dict, key: str = "resources") -> dict:
    """How a training job with resources ``res`` starts its processes: ``processes`` (default one per
    GPU, at least one), the threads each gets (its share of ``cpus_per_task``), and the accelerate
    config file, if any. Raises :class:`ConfigError` naming ``key`` for a plan that cannot run."""
    gpus = res.get("gpu") or 0
    processes = res.get("processes") or max(1, gpus)
    cpus = res.get("cpus_per_task") or 1
    if gpus and processes != gpus:
        raise ConfigError(f"{key}.processes: {processes} processes for {gpus} GPUs; a training job runs one "
                          f"process per GPU (leave processes out, or set gpu: {processes})")
    if processes > cpus:
        raise ConfigError(f"{key}.processes: {processes} processes need at least as many CPUs "
                          f"(cpus_per_task is {cpus})")
    return {"processes": processes, "threads_per_process": max(1, cpus // processes),
            "accelerate_config": res.get("accelerate_config")}


def launch_command(plan: dict) -> list[str]:
    """The command that starts a training step as ``plan`` says (:func:`launch_plan`): ``lara``, or
    ``accelerate launch`` with torchrun-style workers on a free rendezvous port (on CPU accelerate
    runs them as MULTI_CPU over gloo), each with its share of the threads, and the accelerate config
    file (FSDP / DeepSpeed) when one is named."""
    if plan["processes"] == 1 and plan["accelerate_config"] is None:
        return ["lara"]
    args = ["accelerate", "launch"]
    if plan["accelerate_config"] is not None:
        args += ["--config_file", plan["accelerate_config"]]
    else:
        args += ["--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no"]
    return args + ["--num_machines", "1", "--num_processes", str(plan["processes"]), "--main_process_port", "0",
                   "--num_cpu_threads_per_process", str(plan["threads_per_process"]), "-m", "lara"]


def _launch_checks(config: dict) -> list[str]:
    problems = []
    res = config.get("resources", {})
    for rule, override in res.get("rules", {}).items():
        try:
            launch_plan(dict(res.get("default", {})) | override, f"resources.rules.{rule}")
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def looks_local(value: str, base: Path = Path(".")) -> bool:
    """Whether a model or data reference names a local path rather than a hub id (``owner/name``):
    an absolute or ``./``/``../``/``~`` path, a file name with a data extension, more than one
    ``/``, or an ``x/y`` whose ``x`` is a local folder."""
    if value.startswith(("/", "./", "../", "~")) or value in (".", ".."):
        return True
    if Path(value).suffix in (".json", ".jsonl", ".parquet", ".csv", ".tsv", ".safetensors", ".bin"):
        return True
    parts = value.split("/")
    return len(parts) > 2 or (len(parts) == 2 and (base / parts[0]).is_dir())


def require_model(spec: str | Path, flag: str) -> None:
    """Refuse a local model reference that is not a model directory before anything is loaded: a
    path that does not exist, a file, or a folder without config.json. Hub ids (owner/name) pass."""
    spec = str(spec)
    path = Path(spec).expanduser()
    if path.exists() or looks_local(spec):
        if not path.exists():
            raise ConfigError(f"{flag} {spec}: no such model directory")
        if not path.is_dir():
            raise ConfigError(f"{flag} {spec}: a model is a directory (config.json, weights, tokenizer), "
                              "this is a file")
        if not (path / "config.json").is_file():
            raise ConfigError(f"{flag} {spec}: not a model directory (no config.json); an unfinished or "
                              "foreign folder?")


def model_vocab_size(path: Path) -> int | None:
    """``vocab_size`` from a local model directory's config.json (text_config for multimodal ones)."""
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")


def named_scorer_names() -> tuple[str, ...]:
    """The named scorers installed (entry points of ``lara.scorers``, e.g. the toy ``oracle``)."""
    from importlib.metadata import entry_points

    return tuple(sorted(ep.name for ep in entry_points(group="lara.scorers")))


def references(config: dict) -> list[tuple[str, str, str, str]]:
    """Every model and data set an experiment names, as ``(key, value, kind, key of its revision)``: the base
    model, the evaluation scorers and the three data sources (``toy`` and named scorers too; callers skip them)."""
    out = [("base_model.name_or_path", config["base_model"]["name_or_path"], "model", "base_model.revision")]
    out += [(f"evaluation.{role}", config["evaluation"][role], "model", f"evaluation.{role}_revision")
            for role in ("reward_model", "cost_model")]
    out += [(f"data.{part}.source", config["data"][part]["source"], "data", f"data.{part}.revision")
            for part in ("sft", "preferences", "prompts")]
    return out


def check_references(config: dict, base: Path = Path("."), scorers: tuple[str, ...] = ()) -> list[str]:
    """What the workflow would otherwise find out only when a job reaches it: local model and data
    paths that do not exist, and a ``decode.rgtg.METHOD.top_k`` larger than the policy's vocabulary (the
    toy tokenizer's size, or a local base model's config.json). ``scorers``: named scorers."""
    problems = []
    name = config["base_model"]["name_or_path"]
    named = [r for r in references(config) if r[1] not in ("toy", *scorers)]
    refs = [(key, value, kind) for key, value, kind, _ in named]
    for rule, override in config.get("resources", {}).get("rules", {}).items():
        if override.get("accelerate_config"):
            refs.append((f"resources.rules.{rule}.accelerate_config", override["accelerate_config"], "file"))
    # a hub setting (revision, configuration, folder) on the toy world, a named scorer or a local path would be
    # ignored: refused instead
    pinned = []
    for _, value, kind, revision in references(config):
        pinned.append((revision, value))
        if kind == "data" and (value == "toy" or (base / Path(value).expanduser()).is_file()):  # a folder has both
            pinned += [(revision.replace(".revision", f".{k}"), value) for k in ("name", "data_dir")]
    for key, spec in pinned:
        parent, _, field = key.rpartition(".")
        value = section(config, parent).get(field)
        local = looks_local(spec, base) or (base / Path(spec).expanduser()).exists()
        if value is not None and (spec in ("toy", *scorers) or local):
            problems.append(f"{key}: {value!r} is set, but {spec!r} is not a hub id (a hub revision, "
                            "configuration or folder would be ignored)")
    made_here = ("results", config.get("experiment"))  # a data file one of this experiment's rules writes
    for key, value, what in refs:
        if what == "data" and Path(value).parts[:2] == made_here:
            continue
        if looks_local(value, base) and not (base / Path(value).expanduser()).exists():
            problems.append(f"{key}: {value!r} looks like a local {what} path, and there is nothing there "
                            f"(relative paths are read from {base.resolve()}); a hub id is written owner/name")
    vocab, origin = None, ""
    if name == "toy":
        vocab, origin = config["toy"]["tokenizer"]["vocab_size"], "toy.tokenizer.vocab_size"
    elif looks_local(name, base):
        vocab, origin = model_vocab_size(base / Path(name).expanduser()), f"{name}/config.json"
    for method, rgtg in config.get("decode", {}).get("rgtg", {}).items():
        top_k = rgtg.get("top_k") if isinstance(rgtg, dict) else None
        if top_k is not None and vocab is not None and top_k > vocab:
            problems.append(f"decode.rgtg.{method}.top_k: {top_k} candidate tokens per step exceed the vocabulary "
                            f"of {vocab} ({origin})")
    return problems


BASE_POLICIES = ("sft", "safe_rlhf", "safedpo")
TRAIN_SECTIONS = {"safe_rlhf": "train.safe_rlhf", "safedpo": "train.safedpo"}


def _section_schema(schema: dict, dotted: str) -> dict:
    node = schema
    for part in dotted.split("."):
        node = _resolve(node, schema)["properties"][part]
    return {**_resolve(node, schema), "$defs": schema.get("$defs", {})}


def check_value(dotted: str, value, schema: dict | None = None):
    """``value`` for the config key ``dotted``, checked against that key's schema (the one validation a
    config file's value goes through), or :class:`ConfigError` naming the key."""
    schema = schema or load_schema()
    problems = [error_message(e) for e in schema_errors(value, _section_schema(schema, dotted))]
    if problems:
        raise ConfigError(f"{dotted}: {'; '.join(problems)}")
    return value


def variant_settings(config: dict, name: str, part: str) -> dict:
    """A policy's ``train`` or ``generation`` section: the config's, with a variant's overrides."""
    variant = config["decode"].get("policy_variants", {}).get(name)
    base = variant["base"] if variant else name
    dotted = "generation" if part == "generation" else TRAIN_SECTIONS[base]
    return {**section(config, dotted), **((variant or {}).get(part) or {})}


def check_policies(config: dict, schema: dict) -> list[str]:
    """decode.policies names base policies or variants; each variant's overrides are keys of the
    section they override, with values that section's schema accepts."""
    problems = []
    variants = config["decode"].get("policy_variants", {})
    for name, v in variants.items():
        key = f"decode.policy_variants.{name}"
        if name in BASE_POLICIES:
            problems.append(f"{key}: {name} is a base policy's name; give the variant its own")
        if v.get("train") and v["base"] == "sft":
            problems.append(f"{key}.train: the sft policy is the SFT model itself; train overrides apply to "
                            "safe_rlhf and safedpo")
            continue
        for part in ("train", "generation"):
            if not v.get(part):
                continue
            dotted = "generation" if part == "generation" else TRAIN_SECTIONS[v["base"]]
            merged = variant_settings(config, name, part)
            for error in schema_errors(merged, _section_schema(schema, dotted)):
                where = ".".join(str(p) for p in error.absolute_path)
                problems.append(f"{key}.{part}{'.' + where if where else ''}: {error_message(error)} "
                                f"(overriding {dotted})")
    unknown = [p for p in config["decode"]["policies"] if p not in BASE_POLICIES and p not in variants]
    if unknown:
        problems.append(f"decode.policies: {', '.join(unknown)} is neither a base policy ({', '.join(BASE_POLICIES)}) "
                        "nor a decode.policy_variants entry")
    return problems


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
    """The layers a configuration is merged from, in order, each ``(origin, mapping)``.

    A file that names an ``experiment`` is a whole experiment: it starts from the step defaults,
    not from the files before it (so a paper config given after the toy default, as Snakemake's
    ``configfile:`` plus ``--configfile`` does, never inherits a toy value); to build on another
    experiment's file it names it in ``extends:``. A file without ``experiment`` is an overlay on the
    files before it (a τ, a shorter run). ``overrides`` (Snakemake's ``--config``) come last.

    Two orders would change values without a word, and are refused (:class:`ConfigError`, naming the files):
    an overlay given before a whole experiment (whose start from the defaults would drop it), and an experiment
    name that two files name (:func:`check_experiment_names`: a file that names the experiment of the files
    before it would replace all their values with the defaults, in their results folder). ``--config``'s
    ``experiment`` is the name of the results folder: the files' own name changes nothing; another name is a
    copy of the configuration under that name, refused when a file given names it."""
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
        if "experiment" in given and given["experiment"] == experiment_name(out):  # the files' own name: a no-op
            given = {k: v for k, v in given.items() if k != "experiment"}
        out.append(("--config", given))
    check_experiment_names(dropped + out, out)
    return out


def experiment_name(layer_list: list[tuple[str, dict]]):
    """The experiment the layers name (the last that sets ``experiment``), or None (the schema's default)."""
    return next((data["experiment"] for _, data in reversed(layer_list) if "experiment" in data), None)


def experiment_owner(layer_list: list[tuple[str, dict]]) -> str:
    """The origin of the layer that names the experiment (a file, ``--config``), or ``default``."""
    return next((origin for origin, data in reversed(layer_list) if "experiment" in data), "default")


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
    """One experiment name, one config file: of every layer given (``seen``, with those a whole experiment
    started afresh from), the ones that name the experiment the configuration (``kept``) resolves to must all be
    one file. A second file naming it is refused: as a whole experiment it would start from the defaults and
    write them into the first one's results folder (``experiment: tiny`` plus a τ after config/config.yaml
    silently set every toy value to a step default in results/tiny/); so is ``--config`` renaming a configuration
    to it."""
    name = experiment_name(kept)
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
    owner = experiment_owner(layer_list)
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


def load(*paths: str | Path, overrides: dict | None = None, schema: dict | None = None) -> dict:
    """The validated configuration of config files (layered as :func:`layers` says) plus ``overrides``."""
    parts = layers(*paths, overrides=overrides)
    return validate(merged(parts), schema, source=", ".join(str(p) for p in paths) or "config")


def explain(resolved: dict, layer_list: list[tuple[str, dict]], schema: dict | None = None) -> list[dict]:
    """Every resolved key (dotted; a list or a free-form mapping is one value) with its value and its
    origin: the last layer that sets it, else ``default``: the owning step's settings field
    (``step default (lara.train.ppo_lag:PPOLagSettings)``) or the schema's key default."""
    schema = schema or load_schema()
    rows = []

    def origin_of(path: list[str]) -> str:
        for origin, data in reversed(layer_list):
            node = data
            for part in path:
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return origin
        return "default"

    def walk(node, sub_schema, path):
        sub_schema = _resolve(sub_schema or {}, schema)
        props = sub_schema.get("properties")
        extra = sub_schema.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else None
        if isinstance(node, dict) and node and (props is not None or extra is not None):
            for key, value in node.items():
                walk(value, (props or {}).get(key) or extra, [*path, key])
            return
        origin = origin_of(path)
        if origin == "default":
            owner = _owner(path)
            origin = f"step default ({owner})" if owner else "schema default"
        rows.append({"key": ".".join(path), "value": node, "origin": origin})

    walk(resolved, schema, [])
    return rows


def _owner(path: list[str]) -> str | None:
    """The settings dataclass (``module:Class``) that owns the key at ``path``, if any."""
    return SECTIONS.get(".".join(path[:-1]))


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
    lines = []
    for r in rows:
        value = json.dumps(r["value"])
        lines.append(f"{r['key']:<{width}}  {value}  [{r['origin']}]")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# CLI: lara validate-config

HELP = "validate experiment config files against the schema and print the resolved config"


def add_arguments(parser) -> None:
    parser.add_argument("configs", nargs="*", help="YAML files, layered left to right (a file that names an "
                        "experiment starts afresh unless it `extends:` another)")
    parser.add_argument("--layers", default=None,
                        help="instead of files: the layers as the Snakefile made them (JSON list of [origin, mapping])")
    parser.add_argument("--out", default=None, help="write the --explain table here as TSV (key, value, origin)")
    parser.add_argument("--schema", default=None, help="schema file (default: config/schema.yaml)")
    parser.add_argument("--quiet", action="store_true", help="only report errors")
    parser.add_argument("--explain", action="store_true",
                        help="print every resolved key with its value and where it came from (a file, a step's "
                        "default, the schema's default)")


def run(args) -> None:
    schema = load_schema(args.schema) if args.schema else load_schema()
    if args.layers is not None:
        given = strict_json(args.layers, "--layers")
        try:
            parts = [(str(origin), dict(data)) for origin, data in given]
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"--layers: expected a JSON list of [origin, mapping] pairs ({exc})") from None
    elif args.configs:
        parts = layers(*args.configs)
    else:
        raise ConfigError("validate-config: give config files, or --layers")
    config = validate(merged(parts), schema, source=", ".join(o for o, _ in parts) or "config")
    if args.out:
        from lara.io import atomic_output

        with atomic_output(args.out) as tmp:
            Path(tmp).write_text(settings_table(explain(config, parts, schema)))
    if args.quiet:
        return
    if args.explain:
        print(explain_text(explain(config, parts, schema)), end="")
    else:
        print(yaml.safe_dump(config, sort_keys=False), end="")
