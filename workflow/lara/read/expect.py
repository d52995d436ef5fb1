"""Reading an input against a declared expectation: :func:`read` returns a typed :class:`~lara.identity.Artifact` or
refuses in one line naming the flag and the file.

What an :class:`Expect` declares is checked the same way for every command (the contract table,
:mod:`lara.read.contracts`, holds every command's): the identity kinds and prompt pools (roles) the input may be,
the columns it must have, which of them hold numbers (finite, within the range scores can be computed with, never
text or booleans), which hold booleans (a boolean, or the literals ``true``/``false``; never the text "True", never
null), and which column makes a row a *unit* (one response text, normalised, is one candidate within its prompt: the
same response under two sample ids is refused). Ids are text in every format (:mod:`lara.read.files`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from lara.data.errors import DataError
from lara.read.files import _rows  # (importers take it from here too)

TABLE, JSON = "table", "json"
WRITTEN = {"code", "settings"}  # what a lambda record a calibration wrote states beside its identity (a hand-made
# record need not: it is read on its own numbers; one the step wrote, stripped of its identity, is an edited copy)


@dataclass(frozen=True)
class Expect:
    """What one input of one command must be (a row of the contract table)."""

    what: str  # what the input is, in words (said in refusals and printed in docs/architecture.md)
    fmt: str = TABLE
    kinds: tuple[str, ...] = ()  # identity kinds it may carry (empty: any); one written by hand carries none
    roles: tuple[str, ...] = ()  # prompt pools it may cover (empty: any)
    columns: tuple[str, ...] = ()  # required columns
    numbers: tuple[str, ...] = ()  # numeric, finite and within +-SCORE_LIMIT
    booleans: tuple[str, ...] = ()  # booleans or the literals true/false, never null
    unit: str | None = None  # the column whose normalised text is one candidate within a prompt
    row: tuple[str, ...] = ("prompt_id", "sample_id")  # the columns that name one row of a table with units
    per_prompt: int | None = None  # rows per prompt (1: one response per prompt); None: any
    many: bool = False  # the flag takes several files
    agree: tuple[str, ...] = ()  # identity fields that must agree with the command's other inputs naming them
    stamped: bool = False  # only a step writes it: a copy without its identity (metadata stripped) is refused
    keys: tuple[str, ...] = field(default=())  # JSON records: top-level keys it must have
    decoders: tuple[str, ...] = ()  # calibration records: the decoders (decoder.kind) it may be calibrated for
    states: tuple[str, ...] = ()  # identity fields it must state (what its consumers compare; absent: refused)
    unique: tuple[str, ...] = ()  # the columns that name one row of a table without units (each named once)

    def describe(self) -> str:
        parts = ((self.kinds, "kind " + "|".join(self.kinds)), (self.roles, "role " + "|".join(self.roles)),
                 (self.columns or self.keys, "has " + ", ".join(self.columns or self.keys)),
                 (self.numbers, "numbers " + ", ".join(self.numbers)),
                 (self.booleans, "booleans " + ", ".join(self.booleans)), (self.unit, f"one {self.unit} per candidate"),
                 (self.per_prompt, f"{self.per_prompt} row(s) per prompt"),
                 (self.decoders, "calibrated for " + "|".join(self.decoders)),
                 (self.unique, f"one row per ({', '.join(self.unique)})"),
                 (self.stamped, "written by its step only"))
        return "; ".join([self.fmt, *(text for given, text in parts if given)])


def check_numbers(df: pd.DataFrame, columns, where: str) -> None:
    """Numeric columns: numbers (not text, not booleans), finite, within +-SCORE_LIMIT."""
    from lara.read.files import require_in_range

    for col in columns:
        values = df[col]
        if pd.api.types.is_bool_dtype(values) or values.map(lambda v: isinstance(v, (bool, np.bool_))).any():
            raise DataError(f"{where}: column {col!r} holds booleans, expected numbers")
        numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
        text = values.map(lambda v: isinstance(v, str)).to_numpy()
        bad = ~np.isfinite(numbers) | text
        if bad.any():
            unparsed = text & ~np.isfinite(numbers)  # (in a text column, name the cells that are no number at all)
            bad = unparsed if unparsed.any() else bad
            first = int(np.flatnonzero(bad)[0])
            value = values.iloc[first]
            shown = repr(value) if isinstance(value, str) else str(value)
            prompt = f" (prompt {df['prompt_id'].iloc[first]!r})" if "prompt_id" in df.columns else ""
            what = f"text {shown}, not a number," if isinstance(value, str) else f"a non-finite value ({shown})"
            raise DataError(f"{where}: column {col!r} holds {what} at {_rows(bad)}{prompt}")
        require_in_range(df, [col], where)  # (finite now: what is beyond +-SCORE_LIMIT)


def check_nullable_numbers(df: pd.DataFrame, columns, where: str, what: str = "a finite number or empty") -> None:
    """Columns whose cells are finite numbers or empty (a policy's lambda, a failed judge rating): never text, never
    a boolean, never an infinity; the first bad cell named."""
    for col in columns:
        values = df[col]
        numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
        bad = (values.notna().to_numpy() & ~np.isfinite(numbers)) | values.map(
            lambda v: isinstance(v, (bool, np.bool_))).to_numpy()
        if bad.any():
            raise DataError(f"{where}: column {col!r} holds {values[bad].iloc[0]!r} at {_rows(bad)}: {what}")


BOOLEAN_TEXT = {"true": True, "false": False}


def strict_bool(value, where: str):
    """A boolean: a bool, or the literal text true/false (what JSON and YAML 1.2 write). Anything else (the text
    "True", "yes", 1, null) is refused: ``bool("False")`` is True, and a null is not "safe"."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value in BOOLEAN_TEXT:
        return BOOLEAN_TEXT[value]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        raise DataError(f"{where}: no value (null), expected a boolean; a missing label is not a label")
    raise DataError(f"{where}: {value!r} is not a boolean (write true or false)")


def check_booleans(df: pd.DataFrame, columns, where: str) -> pd.DataFrame:
    """Boolean columns, made booleans: the first row that is not one is named."""
    for col in columns:
        values = df[col]
        if pd.api.types.is_bool_dtype(values) and not values.isna().any():
            continue
        out = [strict_bool(v, f"{where}: column {col!r} row {i}") for i, v in enumerate(values)]
        df = df.assign(**{col: np.array(out, dtype=bool)})
    return df


def check_units(df: pd.DataFrame, column: str, where: str) -> None:
    """Within a prompt, one response text (normalised as prompts are: Unicode form, invisible characters, spacing)
    is one candidate: the same text under two sample ids would be counted, and offered, twice."""
    from lara.data.text import prompt_key

    keys = df[column].map(lambda t: prompt_key(t) if isinstance(t, str) else t)
    frame = pd.DataFrame({"p": df["prompt_id"].map(str), "k": keys})
    twice = frame.duplicated(["p", "k"], keep=False).to_numpy()
    if twice.any():
        rows = np.flatnonzero(twice)
        first = frame.iloc[rows[0]]
        same = rows[(frame["p"].to_numpy()[rows] == first["p"]) & (frame["k"].to_numpy()[rows] == first["k"])]
        ids = df["sample_id"].to_numpy()[same].tolist() if "sample_id" in df.columns else same.tolist()
        raise DataError(f"{where}: prompt {first['p']!r} has one {column} under {len(same)} sample ids ({ids[:4]}): "
                        f"one {column} is one candidate; drop the copies ({int(twice.sum())} rows repeat one)")


# tables of candidates drawn from pi_ref by lara sample (and scored, or streamed): a policy draws the same response
# twice as often as it likes, and K i.i.d. draws are what Best-of-N's exact expected cost averages over; the rows of
# such a table are the rows as written (the identity's digest of them, lara.read.files), so a copy is refused there
IMPORTABLE = ("prompts", "samples", "scores", "stream", "responses", "evaluation", "judged")  # import-table's kinds
SAMPLED = ("samples", "scores", "constraint_scores", "stream", "prefix_scores")


def check_pairs(df: pd.DataFrame, row: list[str], where: str) -> None:
    """The columns that name one row (a prompt's sample: prompt_id, sample_id) name it once: a repeated pair would
    count one sample twice."""
    dup = df.duplicated(row, keep=False).to_numpy()
    if dup.any():
        rows = np.flatnonzero(dup)
        pid, sid = (df[c].iloc[rows[0]] for c in row[:2])
        pid = repr(str(pid)) if row[0] == "prompt_id" else pid
        named = ", ".join(str(df[c].iloc[rows[0]]) for c in row[2:])
        raise DataError(f"{where}: {len(rows)} rows repeat a ({', '.join(row)}) pair, e.g. rows "
                        f"{rows[:4].tolist()} ({pid}, {sid}{', ' + named if named else ''}); a duplicated "
                        f"{'sample' if row[0] == 'prompt_id' else 'row'} would be counted twice")


def identity_checks(found: dict, expect: Expect, where: str) -> None:
    kind = found.get("kind")
    if expect.stamped and kind is None:
        made_by = f" ({expect.kinds[0]})" if expect.kinds else ""
        own = (f", or bring your own through `lara import-table --kind {expect.kinds[0]}`, which checks it and states "
               "where it came from") if expect.kinds and expect.kinds[0] in IMPORTABLE else ""
        raise DataError(f"{where}: carries no identity{made_by}: {expect.what} is only ever written by its step, and "
                        f"a copy without its metadata cannot be told from another run's; pass the file the step wrote"
                        f"{own}")
    if expect.kinds and kind is not None and kind not in expect.kinds:
        raise DataError(f"{where}: kind {kind}, expected {' or '.join(expect.kinds)} ({expect.what})")
    unstated = [name for name in expect.states if kind is not None and found.get(name) is None]
    if unstated:
        raise DataError(f"{where}: states no {', '.join(unstated)} ({expect.what}): made by an older step, or edited; "
                        "its consumers compare them with their other inputs: remake it")
    role = found.get("role", found.get("split_role"))
    if expect.roles and role is not None and role not in expect.roles:
        raise DataError(f"{where}: role {role}, expected {' or '.join(expect.roles)} ({expect.what})")


def decoder_check(data: dict, expect: Expect, where: str) -> None:
    """A calibration record is about one decoder (its ``decoder.kind``): a command that decodes, sweeps or audits
    another refuses it, whichever pair of decoders it is (a lambda is calibrated for the decoder that uses it)."""
    decoder = data.get("decoder")
    if not expect.decoders or decoder is None:  # (a lambda record without one is refused by its reader)
        return
    kind = decoder.get("kind") if isinstance(decoder, dict) else None
    if kind not in expect.decoders:
        raise DataError(f"{where}: calibrated for the decoder {kind!r}, expected {' or '.join(expect.decoders)} "
                        f"({expect.what}): a lambda is calibrated for the decoder that uses it, never borrowed")


def read(path: str | Path, flag: str, expect: Expect):
    """``path`` given to ``flag``, read once and checked against ``expect``: an Artifact (``df`` for a table,
    ``data`` for a JSON record; ``identity``), or a DataError naming ``flag`` and ``path``."""
    from lara import identity
    from lara.read import files

    where = f"{flag} {path}"
    if expect.fmt == JSON:
        data = files.json_file(path, where)
        missing = [k for k in expect.keys if k not in data]
        if missing:
            raise DataError(f"{where}: missing key(s) {', '.join(missing)} ({expect.what})")
        found = data.get(identity.KEY) if isinstance(data.get(identity.KEY), dict) else {}
        if not found and set(data) >= WRITTEN and any(k.startswith("lambda") for k in expect.kinds):
            raise DataError(f"{where}: written by a step (it states its {', '.join(sorted(WRITTEN))}) but carries no "
                            "identity: it was removed, and with it the seal that finds an edit; pass the file the step "
                            "wrote")
        decoder_check(data, expect, where)  # the decoder first: another decoder's record is named as such
        identity_checks(found, expect, where)
        return identity.Artifact(flag, str(path), found, None, data)
    df = files.read_table(path, required=expect.columns, where=where)
    files.require_rows(df, where)
    found = identity.read_identity(path)
    if Path(path).suffix.lower() == ".parquet" and "role" not in found:
        role = files.read_metadata(path).get("split_role")
        found = found | ({"role": role} if role else {})
    identity_checks(found, expect, where)
    if expect.numbers:
        check_numbers(df, [c for c in expect.numbers if c in df.columns], where)
    if expect.booleans:
        df = check_booleans(df, [c for c in expect.booleans if c in df.columns], where)
    if expect.unit and all(c in df.columns for c in expect.row):
        check_pairs(df, list(expect.row), where)
    if expect.unique:
        check_pairs(df, list(expect.unique), where)
    if expect.unit and expect.unit in df.columns and "prompt_id" in df.columns and found.get("kind") not in SAMPLED:
        check_units(df, expect.unit, where)
    art = identity.Artifact(flag, str(path), found, df)
    if "prompt_id" in df.columns:
        art.prompts(expect.per_prompt)
    return art
