"""What the step settings (:mod:`lara.settings`) and the config files (:mod:`lara.config`) share, importing
nothing of either: :class:`ConfigError`, the one validator (:func:`strict_validator`) with its messages in words,
the limits on nesting, and the reader of JSON settings (:func:`strict_json`: a key given twice, or nesting deeper
than any configuration, is refused). :mod:`lara.settings` re-exports these names; callers import them from there.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any


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
        if value is None:
            return f"no value (null: the key is written with nothing after it, or ~), expected {_kinds_text(kinds)}"
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
