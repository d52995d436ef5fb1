"""Experiment configuration: load, merge, fill defaults from the schema, validate.

The schema (``config/schema.yaml``) gives every key a description and a default. An
unknown key, a wrong type or an out-of-range value fails with a message that names
the key as a dotted path (``calibration.bootstrap: -1 is less than the minimum of 1``).
The Snakefile calls :func:`validate` before any job is scheduled.

Its parts, whose names that callers use are this module's too (they import them from here): the schema file and the
paths into it (:mod:`lara.config.schema`), the layers a configuration is merged from and the experiment they
name (:mod:`lara.config.layers`), the models and data sets it names (:mod:`lara.config.refs`); config files are
read strictly by :mod:`lara.read.yamlfile`.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

# the parts of the configuration, this package's modules (none imports a name defined here); re-exported: callers
# import them from here
from lara.config.layers import (  # noqa: F401 (re-exported)
    MODULE_CONFIG,
    check_results,
    command_line_values,
    explain,
    explain_text,
    layers,
    load_yaml,
    merge,
    merged,
    module_layers,
    result_layers,
    settings_table,
)
from lara.config.messages import origin_of, problem_origin, unknown_key_hint
from lara.config.refs import (  # noqa: F401 (re-exported)
    check_references,
    looks_local,
    named_scorer_names,
    references,
    require_model,
)
from lara.config.runs import constraints, taus  # noqa: F401 (re-exported)
from lara.config.schema import _resolve, load_schema, schema_node, section  # noqa: F401 (re-exported)
from lara.config.steps import (  # noqa: F401 (re-exported)
    BASE_POLICIES,
    TRAIN_SECTIONS,
    settings_json,
    step_settings,
    variant_settings,
)

# what the settings and the config share lives in lara.settings (which imports nothing of lara.config); the names
# are lara.config's too, where every caller has imported them from
from lara.settings import (  # noqa: F401 (re-exported)
    RENAMED,
    ConfigError,
    dotted_key,
    error_message,
    nonfinite,
    renamed_message,
    schema_errors,
    strict_json,
)


def scenarios(config: dict) -> dict[str, dict]:
    """deployment.scenarios by name (each its schedule without the name); a name given twice is refused (the plan's
    rule, :func:`lara.config.plan.scenario_names_unique`)."""
    from lara.config.plan import scenario_names_unique

    for problem in scenario_names_unique(config):
        raise ConfigError(problem)
    return {item["name"]: {k: v for k, v in item.items() if k != "name"} for item in config["deployment"]["scenarios"]}


def defaults(schema: dict) -> dict:
    """The configuration made of the schema's defaults alone."""
    return _fill({}, schema, schema)


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


def _describe(error, layer_list=None) -> str:
    """One schema error as a line: the dotted key, what is wrong, and (given the layers) which layer set it."""
    if error.validator == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        unknown = sorted(set(error.instance) - known, key=str)
        lines = []
        for key in unknown:
            hint = unknown_key_hint(key, known)
            where = _set_in(layer_list, [*error.absolute_path, key])
            known_here = f" (known keys here: {', '.join(sorted(known))})" if known else ""
            lines.append(f"unknown key {dotted_key([*error.absolute_path, key])}{where}"
                         + (f": {hint}" if hint else known_here))
        return "\n  - ".join(lines)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        what = {"tau": "every experiment states its cost budget (E[c] <= tau, in the cost model's units)"}
        return "; ".join(f"{dotted_key([*error.absolute_path, k])}: missing; {what.get(k, 'it has no default')}"
                         for k in missing)
    return f"{dotted_key(error.absolute_path)}: {error_message(error)}{_set_in(layer_list, list(error.absolute_path))}"


def _set_in(layer_list, path) -> str:
    """`` (set in FILE)``: the layer that set the key at ``path``, when there are layers and one sets it."""
    origin = origin_of(layer_list, path)
    return f" (set in {origin})" if origin else ""


def validate(config: dict, schema: dict | None = None, source: str = "config", layer_list=None,
             root: Path | None = None) -> dict:
    """Return ``config`` with defaults filled in, or raise :class:`ConfigError` naming every
    offending key (and, given ``layer_list``, the file or ``--config`` that set it). After the schema: every
    step's settings as the plan hands them over (:mod:`lara.config.runs`), every rule between sections
    (:mod:`lara.config.plan`), and, given ``root`` (the folder relative paths are read from), every model, data set
    and scorer it names (:func:`check_references`). ``lara validate-config`` and the Snakefile call it with ``root``."""
    _refuse(source, [renamed_message(k) for k in RENAMED if _has_key(config, k)])
    schema = schema or load_schema()
    filled = _fill(copy.deepcopy(config), schema, schema)
    problems = ([_describe(e, layer_list) for e in schema_errors(filled, schema)]
                or [f"{k}: not a finite number (NaN and infinities are refused)" for k in nonfinite(filled)]
                or [p + problem_origin(layer_list, p) for p in _cross_checks(filled, schema, root)])
    _refuse(source, problems)
    return filled


def _refuse(source: str, problems: list[str]) -> None:
    """Refuse a configuration with problems: one :class:`ConfigError` listing each on its own line."""
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"{source}: invalid configuration:\n{lines}")


def _has_key(config: dict, dotted: str) -> bool:
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def _cross_checks(config: dict, schema: dict, root: Path | None = None) -> list[str]:
    """What a JSON Schema cannot state: the constraint list parsed, the policy variants, every step's settings as
    its rules build them, the rules between sections, the launch plans and (given ``root``) the references."""
    from lara.config import plan, runs

    problems = plan.constraints_parse(config) or check_policies(config, schema)
    if problems:
        return problems
    problems = runs.settings_problems(config, schema) + plan.plan_problems(config)
    problems += _launch_checks(config)
    if root is not None:
        problems += check_references(config, root, scorers=named_scorer_names())
    return list(dict.fromkeys(problems))


# the rules that start a training step through lara.config.launch_command (tests/unit/test_config_judged.py keeps
# the list equal to the rules that call launcher())
TRAINING_RULES = ("train_sft", "train_reward_model", "train_cost_model", "train_partial_model", "train_value_model",
                  "train_safe_rlhf", "train_safedpo")
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
    # the plan every training job without an override gets, then each training rule's (a launch plan, processes
    # per GPU, is a training job's only)
    plans = [("resources.default", {})] + [(f"resources.rules.{rule}", override) for rule, override
                                            in res.get("rules", {}).items() if rule in TRAINING_RULES]
    for key, override in plans:
        try:
            launch_plan(dict(res.get("default", {})) | override, key)
        except ConfigError as exc:
            problems.append(str(exc))
    return problems


def _section_schema(schema: dict, dotted: str) -> dict:
    return {**_resolve(schema_node(schema, dotted), schema), "$defs": schema.get("$defs", {})}


def check_value(dotted: str, value, schema: dict | None = None):
    """``value`` for the config key ``dotted``, checked against that key's schema (the one validation a
    config file's value goes through), or :class:`ConfigError` naming the key."""
    schema = schema or load_schema()
    problems = [error_message(e) for e in schema_errors(value, _section_schema(schema, dotted))]
    if problems:
        raise ConfigError(f"{dotted}: {'; '.join(problems)}")
    return value


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


def load(*paths: str | Path, overrides: dict | None = None, schema: dict | None = None) -> dict:
    """The validated configuration of config files (layered as :func:`layers` says) plus ``overrides``."""
    parts = layers(*paths, overrides=overrides)
    return validate(merged(parts), schema, source=", ".join(str(p) for p in paths) or "config", layer_list=parts)


# ---------------------------------------------------------------------------------------------
# CLI: lara validate-config

HELP = "validate experiment config files against the schema and print the resolved config"


def add_arguments(parser) -> None:
    parser.add_argument("configs", nargs="*", help="YAML files, layered left to right (a file that names an "
                        "experiment starts afresh unless it `extends:` another)")
    parser.add_argument("--layers", default=None,
                        help="instead of files: the layers as the Snakefile made them (JSON list of [origin, mapping])")
    parser.add_argument("--config", nargs="+", default=None, metavar="KEY=VALUE",
                        help="values given as Snakemake's --config gives them (KEY=VALUE, a YAML value; layered last)")
    parser.add_argument("--out", default=None, help="write the --explain table here as TSV (key, value, origin)")
    parser.add_argument("--schema", default=None, help="schema file (default: config/schema.yaml)")
    parser.add_argument("--quiet", action="store_true", help="only report errors")
    parser.add_argument("--explain", action="store_true",
                        help="print every resolved key with its value and where it came from (a file, a step's "
                        "default, the schema's default)")


def _command_line_config(items: list[str] | None) -> dict | None:
    """``--config KEY=VALUE ...`` read as Snakemake's ``--config`` reads it (then typed by :func:`layers`)."""
    if not items:
        return None
    from snakemake.cli import parse_config

    out: dict = {}
    for item in items:
        try:
            out = merge(out, parse_config([item]))
        except Exception as exc:  # noqa: BLE001 (Snakemake's parser raises its own errors)
            raise ConfigError(f"--config {item!r}: {exc} (an entry is KEY=VALUE, KEY a top-level key such as "
                              "calibration, VALUE YAML: calibration={tau: -1.0})") from None
    return out


def run(args) -> None:
    if args.schema and not Path(args.schema).is_file():
        raise ConfigError(f"--schema {args.schema}: no such file")
    schema = load_schema(args.schema) if args.schema else load_schema()
    if args.layers is not None:
        given = strict_json(args.layers, "--layers")
        try:
            parts = [(str(origin), dict(data)) for origin, data in given]
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"--layers: expected a JSON list of [origin, mapping] pairs ({exc})") from None
    elif args.configs or args.config:
        parts = layers(*args.configs, overrides=_command_line_config(args.config))
    else:
        raise ConfigError("validate-config: give config files, or --layers")
    config = validate(merged(parts), schema, source=", ".join(o for o, _ in parts) or "config", layer_list=parts,
                      root=Path("."))
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
