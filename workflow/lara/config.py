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
import math
import re
from pathlib import Path

import yaml

# package data (installed with `pip install .`); config/schema.yaml in a checkout is a link to it
SCHEMA_PATH = Path(__file__).resolve().parent / "schemas" / "schema.yaml"
SETTINGS_SCHEMA = "settings.schema.yaml"  # generated from the step settings (lara.settings), beside the schema


class ConfigError(ValueError):
    """A configuration that does not satisfy the schema."""


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
    from lara.settings import SECTIONS, settings_class

    return frozenset(f"{section_name}.{f.name}" for section_name in SECTIONS
                     for f in dataclasses.fields(settings_class(section_name)) if f.metadata.get("several"))


def _one(key: str, value):
    """The value a step reads of a key: the first of a listed ``several`` key (the rule derives the others)."""
    return value[0] if key in several_keys() and isinstance(value, list) else value


def taus(config: dict) -> list[float]:
    """calibration.tau as a list: the main tau first (Safe-RLHF's budget, the audit's headline), then the others."""
    tau = config["calibration"]["tau"]
    return [float(t) for t in (tau if isinstance(tau, list) else [tau])]


def settings_json(config: dict, name: str, schema: dict, **derived) -> str:
    """:func:`step_settings` as sorted JSON, so it changes exactly when a value the step reads does."""
    return json.dumps(step_settings(config, name, schema, **derived), sort_keys=True)


# ---------------------------------------------------------------------------------------------
# one validator for the config files and the steps' settings (lara.settings.Settings)


@functools.cache
def strict_validator():
    """JSON Schema (2020-12) as this project reads it, for the config and the step settings alike: a
    ``number`` is finite (JSON Schema's ranges never fire for NaN, and YAML reads ``.nan`` and ``.inf``),
    an ``integer`` is an int (not ``20.0``, which the standard counts as one and a later step refuses),
    a ``pattern`` must match the whole string (Python's ``$`` also matches before a final newline), and
    ``x-no-credentials`` marks a URL that must not carry a password or key (lara.secrets)."""
    from jsonschema import Draft202012Validator, ValidationError, validators

    def finite_number(checker, instance):
        return isinstance(instance, (int, float)) and not isinstance(instance, bool) and math.isfinite(instance)

    def int_only(checker, instance):
        return isinstance(instance, int) and not isinstance(instance, bool)

    def whole_pattern(validator, pattern, instance, schema):
        if validator.is_type(instance, "string") and re.fullmatch(pattern, instance) is None:
            yield ValidationError(f"{instance!r} does not match {pattern!r}")

    def no_credentials(validator, wanted, instance, schema):
        from lara.secrets import url_credentials

        found = url_credentials(instance) if wanted and isinstance(instance, str) else []
        if found:  # the value itself is never repeated
            yield ValidationError(f"the URL carries credentials ({', '.join(found)}); remove them: a key reaches "
                                  "the judge only through the environment variable named by "
                                  "evaluation.judge.api_key_env, so it is never written to a log, a shell command "
                                  "or a file")

    checker = Draft202012Validator.TYPE_CHECKER.redefine_many({"number": finite_number, "integer": int_only})
    return validators.extend(Draft202012Validator, {"pattern": whole_pattern, "x-no-credentials": no_credentials},
                             type_checker=checker)


def schema_errors(instance, schema: dict) -> list:
    """The errors of ``instance`` against ``schema`` (:func:`strict_validator`), in key order."""
    return sorted(strict_validator()(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])


def error_message(error) -> str:
    """A validation error's message, with the fix for the mistakes people make: a NaN or infinite
    number, an integer written as a float, a number YAML read as a string (``2e-5``), and a schema
    node's own ``x-hint`` (how a literal lambda setting is spelt)."""
    value, expected = error.instance, error.validator_value
    if error.validator == "anyOf" and isinstance(value, (str, float)):  # one value or a list (``several`` keys)
        first = next((e for e in error.context if e.validator == "type"), None)
        if first is not None and error_message(first) != first.message:  # a fix applies: say it
            return error_message(first)
    if error.validator == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        if isinstance(value, float) and not math.isfinite(value):
            return f"{value} is not a finite number (NaN and infinities are refused)"
        if "integer" in kinds and "number" not in kinds and isinstance(value, float) and value.is_integer():
            return f"{value!r} is not an integer; write {int(value)}"
        if {"number", "integer"} & set(kinds) and isinstance(value, str):
            try:
                float(value)
            except ValueError:
                pass
            else:
                if "e" in value.lower() and "." not in value:
                    return (f"{value!r} is a string, not a number: YAML 1.1 reads an exponent without a dot as "
                            f"text; write {_yaml_number(value)}")
                return f"{value!r} is a string, not a number: a quoted number is text in YAML; write {value} unquoted"
    hint = error.schema.get("x-hint") if isinstance(error.schema, dict) else None
    return f"{error.message} ({hint})" if hint else error.message


def _yaml_number(text: str) -> str:
    """``2e-5`` as YAML reads it as a number (``2.0e-5``)."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return text


def nonfinite(value, path: tuple = ()) -> list[str]:
    """Every NaN or infinite number anywhere in ``value`` (a mapping, a list), as dotted keys."""
    if isinstance(value, float) and not math.isfinite(value):
        return [_key(path)]
    if isinstance(value, dict):
        return [k for key, sub in value.items() for k in nonfinite(sub, (*path, key))]
    if isinstance(value, list):
        return [k for i, sub in enumerate(value) for k in nonfinite(sub, (*path, i))]
    return []


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last silently)."""


def _no_duplicates(loader, node, deep=False):
    seen = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"the key {key!r} is given twice in one mapping (lines {seen[key].line + 1} and "
                f"{key_node.start_mark.line + 1}); the second would silently replace the first",
                key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def strict_yaml(stream):
    """``yaml.safe_load``, refusing duplicate keys."""
    return yaml.load(stream, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)


def load_yaml(path: str | Path) -> dict:
    try:
        with open(path) as fh:
            data = strict_yaml(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
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


def _key(path) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _describe(error) -> str:
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - known)
        keys = ", ".join(_key([*error.absolute_path, k]) for k in unknown)
        hint = f" (known keys here: {', '.join(sorted(known))})" if known else ""
        return f"unknown key {keys}{hint}"
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        what = {"tau": "every experiment states its cost budget (E[c] <= tau, in the cost model's units)"}
        return "; ".join(f"{_key([*error.absolute_path, k])}: missing; {what.get(k, 'it has no default')}"
                         for k in missing)
    return f"{_key(error.absolute_path)}: {error_message(error)}"


def validate(config: dict, schema: dict | None = None, source: str = "config") -> dict:
    """Return ``config`` with defaults filled in, or raise :class:`ConfigError` naming every
    offending key."""
    from lara.settings import RENAMED, renamed_message

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
    for key, value, what in refs:
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
    files before it (a τ, a shorter run). ``overrides`` (Snakemake's ``--config``) come last."""
    out: list[tuple[str, dict]] = []
    for path in paths:
        chain = _chain(Path(path))
        if any("experiment" in data for _, data in chain):  # a whole experiment: the files before it do not count
            out = []
        out += chain
    if overrides:
        out.append(("--config", command_line_values(overrides)))
    return out


MODULE_CONFIG = "the config given to `module lara`"


def module_layers(given: dict, base: Path = Path(".")) -> list[tuple[str, dict]]:
    """The layers of a workflow used as a Snakemake module (``module lara: config: ...``): the mapping the caller
    gives is the experiment, one layer; its ``extends`` names a config file to build on (a paper config),
    read relative to the working directory, with that file's own ``extends`` chain."""
    data = dict(given)
    parent = data.pop(EXTENDS, None)
    if parent is None:
        return [(MODULE_CONFIG, data)]
    if not isinstance(parent, str) or not (base / parent).is_file():
        raise ConfigError(f"{MODULE_CONFIG}: {EXTENDS}: {parent!r}: no such config file (read relative to "
                          f"{base.resolve()})")
    return _chain(base / parent) + [(MODULE_CONFIG, data)]


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
    from lara.settings import SECTIONS

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
        try:
            parts = [(str(origin), dict(data)) for origin, data in json.loads(args.layers)]
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
