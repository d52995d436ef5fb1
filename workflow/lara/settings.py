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
Steps without a config section of their own (the audit, the sweep, scoring) register their
settings in :data:`STEPS`. This module imports nothing heavy; the step modules are imported only
to write the schema.

It also holds what the settings and the config files share (:mod:`lara.config` imports them from here,
never the other way round): :class:`ConfigError`, the one validator (:func:`strict_validator`) with its
messages, and the reader of JSON settings (:func:`strict_json`: a key given twice, or nesting deeper than
any configuration, is refused).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal


class ConfigError(ValueError):
    """A configuration, or a step's settings, that the schema refuses (also ``lara.config.ConfigError``)."""


# ---------------------------------------------------------------------------------------------
# one validator for the config files and the steps' settings


@functools.cache
def strict_validator():
    """JSON Schema (2020-12) as this project reads it, for the config and the step settings alike: a
    ``number`` is finite (JSON Schema's ranges never fire for NaN, and YAML reads ``.nan`` and ``.inf``),
    an ``integer`` is an int (not ``20.0``, which the standard counts as one and a later step refuses),
    a ``pattern`` must match the whole string (Python's ``$`` also matches before a final newline),
    ``x-no-credentials`` marks a URL that must not carry a password or key, and ``x-env-name`` the name of an
    environment variable that must not be a key itself (lara.secrets; neither message repeats the value)."""
    from jsonschema import Draft202012Validator, ValidationError, validators

    from lara.secrets import env_name_problem, url_credentials

    def finite_number(checker, instance):
        return isinstance(instance, (int, float)) and not isinstance(instance, bool) and math.isfinite(instance)

    def int_only(checker, instance):
        return isinstance(instance, int) and not isinstance(instance, bool)

    def whole_pattern(validator, pattern, instance, schema):
        if validator.is_type(instance, "string") and re.fullmatch(pattern, instance) is None:
            yield ValidationError(f"{instance!r} does not match {pattern!r}")

    def no_credentials(validator, wanted, instance, schema):
        found = url_credentials(instance) if wanted and isinstance(instance, str) else []
        if found:  # the value itself is never repeated
            yield ValidationError(f"the URL carries credentials ({', '.join(found)}); remove them: a key reaches "
                                  "the judge only through the environment variable named by "
                                  "evaluation.judge.api_key_env, so it is never written to a log, a shell command "
                                  "or a file")

    def env_name(validator, wanted, instance, schema):
        problem = env_name_problem(instance) if wanted and isinstance(instance, str) else None
        if problem:  # the value itself is never repeated: it may be the key
            yield ValidationError(problem)

    checker = Draft202012Validator.TYPE_CHECKER.redefine_many({"number": finite_number, "integer": int_only})
    return validators.extend(Draft202012Validator, {"pattern": whole_pattern, "x-no-credentials": no_credentials,
                                                    "x-env-name": env_name}, type_checker=checker)


def schema_errors(instance, schema: dict) -> list:
    """The errors of ``instance`` against ``schema`` (:func:`strict_validator`), in key order."""
    return sorted(strict_validator()(schema).iter_errors(instance), key=lambda e: [str(p) for p in e.absolute_path])


def error_message(error) -> str:
    """A validation error's message, with the fix for the mistakes people make: a NaN or infinite
    number, an integer written as a float, a number YAML read as a string (``2e-5``), and a schema
    node's own ``x-hint`` (how a literal lambda setting is spelt)."""
    value, expected = error.instance, error.validator_value
    if isinstance(error.schema, dict) and error.schema.get("x-env-name") and error.validator != "x-env-name":
        return "must be the name of an environment variable (a string; the value is not repeated here)"
    if error.validator == "anyOf" and isinstance(value, (str, float)):  # one value or a list (``several`` keys)
        first = next((e for e in error.context if e.validator == "type"), None)
        if first is not None and error_message(first) != first.message:  # a fix applies: say it
            return error_message(first)
    if error.validator in ("anyOf", "oneOf") and error.context:
        return _alternatives_message(error)
    if error.validator == "type":
        kinds = expected if isinstance(expected, list) else [expected]
        if isinstance(value, bool) and "boolean" not in kinds:
            return _yaml_boolean_message(value, kinds)
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
    if error.validator == "pattern" and error.validator_value in PATTERN_WORDS and not (
            isinstance(error.schema, dict) and error.schema.get("x-hint")):
        return f"{_short(value)} is not {PATTERN_WORDS[error.validator_value]}"
    if error.validator == "type" and value is None:
        kinds = expected if isinstance(expected, list) else [expected]
        return (f"no value (null: the key is written with nothing after it, or ~), expected {_kinds_text(kinds)}")
    if error.validator in ("minItems", "maxItems") and isinstance(error.schema, dict) and isinstance(value, list):
        low, high = error.schema.get("minItems"), error.schema.get("maxItems")
        wanted = (f"exactly {low}" if low == high else f"at least {low}" if high is None
                  else f"at most {high}" if low is None else f"{low} to {high}")
        return f"{_short(value)} has {len(value)} value(s); this key takes {wanted}"
    hint = error.schema.get("x-hint") if isinstance(error.schema, dict) else None
    return f"{error.message} ({hint})" if hint else error.message


# the schema's name patterns in words (a message shows the rule, not the regular expression)
PATTERN_WORDS = {
    "^[a-z][a-z0-9_]*$": "a name of lower-case letters, digits and _ that starts with a letter (it names a results "
                         "folder, a column or a role)",
    "^[A-Za-z0-9_-]+$": "a name of letters, digits, _ and - (it names the results folder results/<name>/)",
}

# what YAML 1.1 (PyYAML, Snakemake's reader) reads as a boolean when unquoted
YAML11_BOOLEANS = {True: ("yes", "on", "true"), False: ("no", "off", "false")}
KIND_NAMES = {"string": "a string", "number": "a number", "integer": "an integer", "array": "a list",
              "object": "a mapping", "null": "null", "boolean": "a boolean"}


def _kinds_text(kinds) -> str:
    names = [KIND_NAMES.get(k, f"a {k} values" if k.startswith("list of") else k) for k in dict.fromkeys(kinds)]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _yaml_boolean_message(value: bool, kinds) -> str:
    """A boolean where text or a number was expected: YAML 1.1 reads ``no``, ``on``, ``yes`` as booleans."""
    words = "/".join(YAML11_BOOLEANS[value])
    return (f"{str(value).lower()} is a boolean, expected {_kinds_text(kinds)}: YAML 1.1 reads an unquoted {words} "
            f"(any case) as {str(value).lower()}; if you meant the word, quote it ('{YAML11_BOOLEANS[value][0]}')")


def _alternatives_message(error) -> str:
    """A value that fits none of a key's forms (``anyOf``/``oneOf``): the reason of each form its type fits (a
    number out of range, a list of the wrong length), else which forms there are; never only "not valid under any
    of the given schemas". For ``oneOf``, a value that fits two forms says so."""
    value = error.instance
    by_form: dict[int, list] = {}
    for sub in error.context:
        by_form.setdefault(sub.relative_schema_path[0], []).append(sub)
    forms = error.validator_value
    fitting = [i for i in range(len(forms)) if not any(
        e.validator == "type" and not e.relative_path for e in by_form.get(i, []))]
    if error.validator == "oneOf" and len(fitting) > 1 and not any(by_form.get(i) for i in fitting):
        return f"{error.message} (it fits {len(fitting)} of the forms, and exactly one must)"
    if fitting:
        reasons = []
        for i in fitting:
            for sub in by_form.get(i, []):
                where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in sub.relative_path)
                text = error_message(sub)
                reasons.append(f"item {where.strip('.')}: {text}" if where else text)
        if reasons:
            return "; ".join(dict.fromkeys(reasons))
    for sub in error.context if isinstance(value, str) else []:  # a quoted number, an exponent read as text
        if sub.validator == "type" and not sub.relative_path and error_message(sub) != sub.message:
            return error_message(sub)
    kinds = []
    for form in forms:
        kind = form.get("type") if isinstance(form, dict) else None
        if kind == "array" and form.get("minItems") is not None and form.get("minItems") == form.get("maxItems"):
            kinds.append(f"list of {form['minItems']}")
        elif kind is not None:
            kinds.append(kind if isinstance(kind, str) else "/".join(kind))
        elif isinstance(form, dict) and "enum" in form:
            kinds.append("one of " + ", ".join(repr(v) for v in form["enum"]))
        elif isinstance(form, dict) and "const" in form:
            kinds.append(repr(form["const"]))
    got = type(value).__name__ if not isinstance(value, bool) else "boolean"
    if isinstance(value, bool) and not any(k == "boolean" for k in kinds):
        return _yaml_boolean_message(value, kinds or ["string"])
    described = _kinds_text(kinds) if kinds else "another form"
    if value is None:
        return f"no value (null: the key is written with nothing after it, or ~), expected {described}"
    return f"{_short(value)} ({got}) is none of the forms this key takes: {described}"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN_LENGTH else text[:SHOWN_LENGTH - 3] + "..."


def _yaml_number(text: str) -> str:
    """``2e-5`` as YAML reads it as a number (``2.0e-5``)."""
    mantissa, _, exponent = text.lower().partition("e")
    if exponent and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return text


def dotted_key(path) -> str:
    """A key path (``("calibration", "tau")``) as a dotted key, each part as :func:`shown`."""
    return ".".join(shown(p) for p in path) or "<top level>"


def nonfinite(value, path: tuple = ()) -> list[str]:
    """Every NaN or infinite number anywhere in ``value`` (a mapping, a list), as dotted keys."""
    if isinstance(value, float) and not math.isfinite(value):
        return [dotted_key(path)]
    if isinstance(value, dict):
        return [k for key, sub in value.items() for k in nonfinite(sub, (*path, key))]
    if isinstance(value, list):
        return [k for i, sub in enumerate(value) for k in nonfinite(sub, (*path, i))]
    return []


SHOWN_LENGTH = 64  # a key in a message: longer ones are cut (a hostile key could be megabytes)


def shown(key) -> str:
    """A key as a message shows it: itself when short and printable, else its ``repr``, cut to a few dozen
    characters with its length, so a message stays one line of reasonable length."""
    text = str(key)
    if text.isprintable() and text.isascii() and text == text.strip() and len(text) <= SHOWN_LENGTH:
        return text
    if len(text) <= SHOWN_LENGTH:
        return repr(text)
    return f"{text[:40]!r}... ({len(text)} characters)"


def listed(keys, most: int = 8) -> str:
    """Keys for a message, comma-separated, at most ``most`` of them (then how many more)."""
    keys = list(keys)
    more = f" and {len(keys) - most} more" if len(keys) > most else ""
    return ", ".join(keys[:most]) + more


# ---------------------------------------------------------------------------------------------
# nesting: no configuration is more than a few levels deep, or more than a few thousand values

MAX_DEPTH = 32  # levels of mappings and lists (the deepest real key, resources.rules.RULE.KEY, is 4)
MAX_VALUES = 100_000  # values a configuration expands to (YAML aliases of aliases: a "billion laughs")


def nesting_problem(root, children) -> tuple[str, Any] | None:
    """The first of these limits that ``root`` passes, as ``(problem, node)``, or None: nested deeper than
    :data:`MAX_DEPTH`, expanding to more than :data:`MAX_VALUES` values (counting a shared node at every place
    it appears), or containing itself. ``children(node)``: a node's children. Iterative, and linear in the
    distinct nodes (each is measured once), so neither depth nor aliases make it recurse or blow up."""
    height: dict[int, int] = {}
    size: dict[int, int] = {}
    state: dict[int, int] = {}  # 1: entered, its children being walked (an ancestor of the current node); 2: done
    stack = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            kids = children(node)
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            state[key] = 2
            if height[key] > MAX_DEPTH:
                return f"a value nested more than {MAX_DEPTH} levels deep (a configuration is a few levels deep)", node
            if size[key] > MAX_VALUES:
                return (f"a value that expands to more than {MAX_VALUES} values (aliases of aliases, a 'billion "
                        "laughs'?); write the values out"), node
            continue
        if state.get(key) == 2:
            continue
        if state.get(key) == 1:
            return "a value that contains itself (an alias inside its own anchor)", node
        state[key] = 1
        stack.append((node, True))
        stack.extend((k, False) for k in children(node))
    return None


def _value_children(value) -> list:
    if isinstance(value, dict):
        return [*value.keys(), *value.values()]
    if isinstance(value, (list, tuple)):
        return list(value)
    return []


def check_nesting(value, origin: str) -> None:
    """Refuse (:class:`ConfigError`, naming ``origin``) a parsed configuration or settings value that is nested
    deeper than :data:`MAX_DEPTH`, expands to more than :data:`MAX_VALUES` values or contains itself."""
    found = nesting_problem(value, _value_children)
    if found:
        raise ConfigError(f"{origin}: {found[0]}")


def strict_json(text: str, origin: str = "--settings"):
    """JSON as every step reads its settings: a key given twice in one object (``{"tau": 1, "tau": -1}``, where
    ``json.loads`` keeps the last silently), and nesting deeper than any configuration, are refused naming
    ``origin``, never a traceback."""
    try:
        return _strict_loads(text, origin)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{origin}: not valid JSON: {exc}") from None


def _strict_loads(text: str, origin: str):
    """:func:`strict_json`, leaving text that is not JSON to raise ``json.JSONDecodeError``."""

    from lara.read.jsontext import no_duplicate_keys

    try:
        data = json.loads(text, object_pairs_hook=no_duplicate_keys(origin, ConfigError, lambda k: repr(shown(k))))
    except RecursionError:
        raise ConfigError(f"{origin}: nested too deeply to read (a configuration is a few levels deep)") from None
    check_nesting(data, origin)
    return data

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
    "decode.bon_prune": "lara.decode.prune:PruneSettings",
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


# steps that read no config section of their own, only other sections' keys (their ``key=`` fields)
STEPS: dict[str, str] = {
    "score": "lara.score:ScoreSettings",
    "bon-sweep": "lara.decode.sweep:SweepSettings",
    "coverage-prune": "lara.calibrate.prune_coverage:PruneCoverageSettings",
    "score-prefixes": "lara.decode.prune:PruneScheduleSettings",
    "select-bon-prune": "lara.decode.prune:PruneScheduleSettings",
    "bon-prune-sweep": "lara.decode.prune_sweep:PruneSweepSettings",
    "aggregate": "lara.evaluate.aggregate:AuditSettings",
    "calibrate-decoder": "lara.calibrate.direct:DirectSettings",
    "prompt-features": "lara.deploy.features:FeatureSettings",
    "category-pairs": "lara.constraints.pairs:CategoryPairsSettings",
}

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
        problems = [f"{cls.key(str(e.absolute_path[0]))}: {error_message(e)}" for e in schema_errors(values, schema)]
        if not problems:
            problems = [p for rule in cls.cross_key_rules() if (p := rule(self))]
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))

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
