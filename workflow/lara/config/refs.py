"""The models and data sets an experiment names, checked before any job is planned: a local path that holds
nothing, a hub setting that a local path or the toy world would ignore, a ``top_k`` beyond the vocabulary.
:mod:`lara.config` re-exports these names."""

from __future__ import annotations

import re
from pathlib import Path

from lara.config.schema import section
from lara.settings import ConfigError


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
    from lara.read.files import DataError, json_file  # pandas, which the table readers need: only here

    try:
        cfg = json_file(path / "config.json")
    except (OSError, DataError):
        return None
    return cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")


def named_scorer_names() -> tuple[str, ...]:
    """The named scorers installed (entry points of ``lara.scorers``, e.g. the toy ``oracle``)."""
    from lara.scorer_specs import named_scorers

    return tuple(sorted(named_scorers()))


def references(config: dict) -> list[tuple[str, str, str, str]]:
    """Every model and data set an experiment names, as ``(key, value, kind, key of its revision)``: the base
    model, the evaluation scorers and the three data sources (``toy`` and named scorers too; callers skip them)."""
    out = [("base_model.name_or_path", config["base_model"]["name_or_path"], "model", "base_model.revision")]
    for role in ("reward_model", "cost_model"):
        spec = config["evaluation"][role]
        argument = _spec_argument(spec)
        out.append((f"evaluation.{role}", spec, "model", f"evaluation.{role}_revision") if not argument
                   else (f"evaluation.{role}", argument, "model", None))
    out += [(f"data.{part}.source", config["data"][part]["source"], "data", f"data.{part}.revision")
            for part in ("sft", "preferences", "prompts")]
    if config.get("deployment", {}).get("scenarios"):
        out.append(("deployment.prompts.source", config["deployment"]["prompts"]["source"], "data",
                    "deployment.prompts.revision"))
    return out + scorer_references(config)


def scorer_references(config: dict) -> list[tuple[str, str, str, None]]:
    """The scorer specs of the constraints stage that name a model (a folder or a hub id; no revision key): the
    constraint reward and each constraint's cost and evaluation scorer. Named scorers and the experiment's own
    models (``reward``, ``cost``, ``category:...``) are left out; ``name:argument`` gives its argument when it is
    a path (``fluency:<model folder>``)."""
    cal = config.get("calibration", {})
    specs = [("calibration.constraint_reward", cal.get("constraint_reward"))]
    for i, item in enumerate(cal.get("constraints") or []):
        if isinstance(item, dict):
            specs += [(f"calibration.constraints[{i}].{k}", item.get(k)) for k in ("cost", "evaluation")]
    judges = (config.get("evaluation") or {}).get("judges") or []
    specs += [(f"evaluation.judges[{i}]", spec) for i, spec in enumerate(judges)]
    out = []
    for key, spec in specs:
        if not isinstance(spec, str) or spec in ("reward", "cost") or spec.startswith("category:"):
            continue
        argument = _spec_argument(spec)
        value = argument or spec
        if argument or "/" in value or value.startswith((".", "~")):
            out.append((key, value, "model", None))
    return out


def _spec_argument(spec: str) -> str | None:
    """The model a ``name:argument`` scorer spec names (``fluency:<folder>``): its argument when it is a path or a
    hub id; None for a spec without a named scorer's prefix (itself a folder or hub id) or an argument that is no
    path (``hatesonar:hate``)."""
    name, colon, argument = spec.partition(":")
    if not colon or "/" in name or not name:
        return None
    if "/" in argument or argument.startswith((".", "~")) or _argument_is_model(name):
        return argument
    return ""


def _argument_is_model(name: str) -> bool:
    """Whether the named scorer ``name`` takes a model folder as its argument (its factory's ``argument_is_model``;
    ``fluency:<causal LM folder>``)."""
    from lara.scorer_specs import named_scorers

    entry = named_scorers().get(name)
    return bool(entry is not None and getattr(entry.load(), "argument_is_model", False))


# the model folders results/{experiment}/models/<name> the workflow's rules write (besides the policy variants and
# each category constraint's cost_<slug>)
MODEL_FOLDERS = ("base", "sft", "reward", "cost", "partial_reward", "partial_cost", "value_reward", "value_cost",
                 "safe_rlhf", "safedpo")


def made_models(config: dict) -> set[str]:
    """The names under results/{experiment}/models/ that this configuration's rules write."""
    from lara.constraints.spec import category_slug

    names = set(MODEL_FOLDERS) | set(config.get("decode", {}).get("policy_variants", {}))
    for item in config.get("calibration", {}).get("constraints") or []:
        cost = item.get("cost") if isinstance(item, dict) else None
        if isinstance(cost, str) and cost.startswith("category:"):
            names.add(f"cost_{category_slug(cost[len('category:'):])}")
    return names


HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")  # owner/name (lara.hub's pattern)
DATA_FILES = (".jsonl", ".json", ".parquet", ".csv")  # the local data files lara.data.ingest reads


def check_references(config: dict, base: Path = Path("."), scorers: tuple[str, ...] = ()) -> list[str]:
    """What the workflow would otherwise find out only when a job reaches it: local model and data
    paths that do not exist, and a ``decode.rgtg.METHOD.top_k`` larger than the policy's vocabulary (the
    toy tokenizer's size, or a local base model's config.json). ``scorers``: named scorers."""
    problems = []
    name = config["base_model"]["name_or_path"]
    named = [r for r in references(config) if r[1] not in ("toy", *scorers) and r[1].partition(":")[0] not in scorers]
    refs = [(key, value, kind) for key, value, kind, _ in named]
    resources = config.get("resources", {})
    plans = [("resources.default", resources.get("default", {}))]
    plans += [(f"resources.rules.{rule}", override) for rule, override in resources.get("rules", {}).items()]
    refs += [(f"{key}.accelerate_config", res["accelerate_config"], "file") for key, res in plans
             if res.get("accelerate_config")]
    # a hub setting (revision, configuration, folder) on the toy world, a named scorer or a local path would be
    # ignored: refused instead
    pinned = []
    for _, value, kind, revision in references(config):
        if revision is None:
            continue
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
        parts = Path(value).parts
        if parts[:2] == made_here and (what == "data" or parts[2:4] in {("models", m) for m in made_models(config)}):
            continue  # a file or model folder one of this experiment's rules writes
        here = base / Path(value).expanduser()
        if looks_local(value, base) and not here.exists():
            problems.append(f"{key}: {value!r} looks like a local {what} path, and there is nothing there "
                            f"(relative paths are read from {base.resolve()}); a hub id is written owner/name")
        elif not here.exists() and not HUB_ID.match(value) and what != "file":
            problems.append(f"{key}: {value!r} is neither a local {what} path (nothing is there) nor a hub id "
                            "(owner/name, which the fetch step downloads); write the hub id in full, owner/name (a "
                            "model the hub lists under a bare name has one too, e.g. openai-community/gpt2)")
        elif what == "data" and here.is_file() and here.suffix.lower() not in DATA_FILES:
            problems.append(f"{key}: {value!r} is a {here.suffix or 'suffix-less'} file; a local data set is one of "
                            f"{', '.join(DATA_FILES)} (or a folder of them)")
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
