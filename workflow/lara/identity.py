"""What an artifact is, carried by the artifact and checked by its consumer, in one place.

Every table and record a step writes says what it is (its *identity*): the kind of artifact, the
experiment, the prompt pool it covers and a digest of that prompt set, tau, the decoder and N, the
calibration mode and procedure, the lambda setting and value, the lambda record it was decoded with,
and digests of the files it was made from. Parquet tables carry it in their ``lara`` metadata record
(key ``identity``), JSON records at their top level (key ``identity``); a CSV carries what matters of it
in its own columns (the sweep's ``tau``, ``record`` and ``prompt_set``).

A consumer never trusts that a file is what its flag says: :func:`table` reads a table with its
identity, and :meth:`Artifact.expect` compares each field the step needs with what it expects, naming
both sides on a mismatch (``--bon-star x.parquet: setting zero (lambda = 0), expected star (lambda* =
0.162 from lambda.json)``). What can be read off the data is read off the data (a table's ``setting``,
``lambda`` and ``method`` columns, its prompt set), never taken from the metadata alone, so a table
re-saved without its metadata is still checked. Consumers that combine several artifacts check they
agree (:func:`same_prompts`, :func:`disjoint`): the same test prompts, and calibration prompts that are
not audit prompts.

Counting goes by distinct prompts (:func:`prompt_table`): a prompt id given twice, the same file
passed twice, ids that collapse to one ("01" and "1", 1 and "1") or two ids for one prompt text (equal
up to Unicode form, invisible characters and whitespace: :func:`lara.data.splits.prompt_key`) are
refused, naming them; n is never a row count.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from lara.data.errors import DataError
from lara.data.ids import check_id_types, id_key  # (callers use identity.id_key: "01", 1 and "1" are one id)
from lara.io import sha256_path
from lara.read.files import json_file, read_metadata, read_table, require_finite, require_rows
from lara.settings import CERTIFIED

KEY = "identity"
MISSING = object()


# ---------------------------------------------------------------------------------------------
# prompt sets: what a table covers, counted by distinct prompts


def text_key(text) -> str:
    """A prompt's identity by its text: the hash of :func:`lara.data.splits.prompt_key` (Unicode form,
    invisible characters and whitespace do not make another prompt)."""
    from lara.data.text import prompt_key

    return hashlib.sha256(prompt_key(text).encode()).hexdigest()[:16]


def digest(keys) -> str:
    return hashlib.sha256("\n".join(sorted(set(keys))).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PromptSet:
    """The distinct prompts of a table: their count, a digest, and the text keys (for disjointness)."""

    n: int
    digest: str
    keys: frozenset = field(repr=False, default=frozenset())

    def record(self, with_keys: bool = False) -> dict:
        return {"n": self.n, "digest": self.digest} | ({"keys": sorted(self.keys)} if with_keys else {})


def prompt_set(df: pd.DataFrame, where: str, per_prompt: int | None = None) -> PromptSet:
    """The distinct prompts of ``df`` (by ``prompt_id``, and by text where a ``prompt`` column is there),
    refusing ids that collapse to one, two ids for one text, and (``per_prompt``: the rows each prompt
    has, 1 for a table of one response per prompt) a prompt given more often than that."""
    if "prompt_id" not in df.columns:
        raise DataError(f"{where}: no prompt_id column")
    ids = df["prompt_id"]
    distinct = pd.Series(pd.unique(ids), dtype=object)
    check_id_types(pd.DataFrame({"prompt_id": distinct}), where, ("prompt_id",))  # "01" and "1": one id
    if per_prompt is not None:
        counts = ids.map(id_key).value_counts()
        over = counts[counts > per_prompt]
        if len(over):
            raise DataError(f"{where}: prompt {over.index[0]!r} has {int(over.iloc[0])} rows, expected {per_prompt} "
                            f"({len(over)} prompt(s) repeated: a file passed twice, or rows copied?); n counts "
                            "distinct prompts, never rows")
    if "prompt" not in df.columns:  # known by id alone: its keys say so (ID_KEY), and only ids are compared with them
        ids = distinct.map(id_key)
        return PromptSet(len(distinct), digest(ids), frozenset(ID_KEY + i for i in ids))
    pairs = df[["prompt_id", "prompt"]].drop_duplicates("prompt_id")
    keys = pairs["prompt"].map(text_key)
    twice = keys.duplicated(keep=False)
    if twice.any():
        both = pairs.loc[twice.to_numpy(), "prompt_id"].tolist()
        raise DataError(f"{where}: prompts {both[0]!r} and {both[1]!r} are one prompt (the same text up to Unicode "
                        "form, invisible characters and whitespace); count it once")
    return PromptSet(len(pairs), digest(keys), frozenset(keys))


def same_prompts(sets: dict[str, PromptSet], what: str = "test prompts") -> None:
    """Artifacts that are compared or pooled cover the same prompts: the first that does not is named
    with how many prompts each has and how many they share."""
    items = list(sets.items())
    first_name, first = items[0]
    for name, other in items[1:]:
        if other.digest != first.digest:
            shared = len(first.keys & other.keys) if first.keys and other.keys else "?"
            raise DataError(f"{name}: covers other {what} than {first_name} ({other.n} and {first.n} prompts, "
                            f"{shared} shared); compare outputs on one prompt set")


ID_KEY = "id:"  # the key of a prompt a table names by its id alone (no prompt text)


def distinct_pools(sets: dict[str, PromptSet], flag: str = "--scores") -> None:
    """Tables pooled into one population (a coverage study's) share no prompt, by text or, where a table has no
    text, by id: the same prompts again under new ids would count each prompt twice. The first two that share are
    named."""
    items = list(sets.items())
    for i, (name, found) in enumerate(items):
        for first, other in items[:i]:
            shared = found.keys & other.keys
            if shared:
                raise DataError(f"{flag} {first} and {name}: share {len(shared)} prompt(s) (by text, or by id where a "
                                "table has no text); the population's prompts must be distinct")


def disjoint(calibration: PromptSet | dict | None, audit: PromptSet, where: str) -> int:
    """How many audit prompts are calibration prompts (0 for a held-out audit); keys from a record's
    identity or a :class:`PromptSet`. Prompts named by text on one side and by id alone on the other cannot be told
    apart: refused, naming ``where``."""
    if calibration is None:
        return 0
    keys = calibration.keys if isinstance(calibration, PromptSet) else frozenset(calibration.get("keys") or ())
    if not keys or not audit.keys:
        return 0  # (a record of an older version states no keys)
    by_id = {side: all(k.startswith(ID_KEY) for k in ks) for side, ks in (("cal", keys), ("audit", audit.keys))}
    if by_id["cal"] != by_id["audit"]:
        named, bare = ("the audited", "the calibration") if by_id["cal"] else ("the calibration", "the audited")
        raise DataError(f"{where}: {named} prompts carry their texts and {bare} prompts only ids: whether they overlap "
                        "cannot be told; give both tables their prompt column")
    return len(keys & audit.keys)


# ---------------------------------------------------------------------------------------------
# the identity a writer stamps


def file_digest(path: str | Path) -> str:
    return sha256_path(path)[:16]


def stamp(kind: str, out: str | Path, made_from: dict[str, str | Path | None] | None = None, **fields) -> dict:
    """An artifact's identity: its ``kind``, the experiment (from ``results/<experiment>/`` in its path,
    else its inputs'), ``fields`` (None values dropped) and the digests of the files it was made from."""
    inputs = {flag: file_digest(p) for flag, p in (made_from or {}).items() if p is not None and Path(p).is_file()}
    return {"kind": kind, "experiment": experiment_of(out), **{k: v for k, v in fields.items() if v is not None},
            "made_from": inputs}


def experiment_of(path: str | Path) -> str | None:
    parts = Path(path).absolute().parts
    for i, part in enumerate(parts[:-1]):
        if part == "results" and i + 1 < len(parts) - 1:
            return parts[i + 1]
    return None


def inherit(identity: dict, *keys: str) -> dict:
    """The fields of an input's identity that an output made from it keeps (what it was decoded with)."""
    return {k: identity[k] for k in keys if k in identity}


# ---------------------------------------------------------------------------------------------
# reading an artifact and checking it is what the flag says


def read_identity(path: str | Path) -> dict:
    """The identity an artifact carries ({} for a file written by hand or before identities existed)."""
    path = Path(path)
    try:
        if path.suffix.lower() == ".parquet":
            found = read_metadata(path).get(KEY)
        elif path.suffix.lower() == ".json":
            data = json_file(path, mapping=False)
            found = data.get(KEY) if isinstance(data, dict) else None
        else:
            found = None
    except (OSError, ValueError):
        found = None
    return found if isinstance(found, dict) else {}


def _constant(df: pd.DataFrame, column: str, where: str):
    """The one value a column holds in every row (MISSING without the column)."""
    if column not in df.columns:
        return MISSING
    values = pd.unique(df[column])
    if len(values) > 1:
        raise DataError(f"{where}: column {column!r} holds several values ({', '.join(map(repr, values[:4]))}); this "
                        "input is one output (one method at one lambda setting)")
    value = values[0] if len(values) else MISSING
    return value.item() if hasattr(value, "item") else value


def _same(got, want) -> bool:
    if isinstance(want, float) or isinstance(got, float):
        try:
            return math.isclose(float(got), float(want), rel_tol=1e-9, abs_tol=1e-12)
        except (TypeError, ValueError):
            return False
    return got == want


@dataclass
class Artifact:
    """An input as read: its flag, path, table (for tables) and identity."""

    flag: str
    path: str
    identity: dict
    df: pd.DataFrame | None = None
    data: dict | None = None  # a JSON record's content

    @property
    def where(self) -> str:
        return f"{self.flag} {self.path}"

    def field(self, name: str):
        """A field of the artifact: from its data where the data says it (a constant column), else its identity."""
        if self.df is not None:
            value = _constant(self.df, name, self.where)
            if value is not MISSING:
                return value
        return self.identity.get(name, MISSING)

    def expect(self, name: str, want, say: str | None = None, shown=None) -> None:
        """Refuse unless field ``name`` is ``want``: ``NAME GOT, expected WANT (SAY)``. A field the artifact
        does not carry is not checked (a table written by hand); one it carries must match."""
        got = self.field(name)
        if got is MISSING or _same(got, want):
            return
        show = shown or repr
        raise DataError(f"{self.where}: {name} {show(got)}, expected {show(want)}" + (f" ({say})" if say else ""))

    def prompts(self, per_prompt: int | None = None) -> PromptSet:
        return prompt_set(self.df, self.where, per_prompt)


def table(path: str | Path, flag: str, required=(), finite=()) -> Artifact:
    """Read a table with its identity (lara.read.files.read_table's checks, and ``finite`` columns finite)."""
    df = require_rows(read_table(path, required=required), path)
    if finite:
        require_finite(df, finite, path)
    return Artifact(flag, str(path), read_identity(path), df)


def distinct_files(paths: list[str | Path], flag: str) -> None:
    """The same file given twice to one flag (by content, whatever its name) would count its rows twice."""
    seen: dict[str, str] = {}
    for p in paths:
        key = file_digest(p) if Path(p).exists() else str(p)
        if key in seen:
            raise DataError(f"{flag}: {p} and {seen[key]} are the same file (identical content); each output is "
                            "given once")
        seen[key] = str(p)


# ---------------------------------------------------------------------------------------------
# decoded outputs against the lambda record they claim to be decoded with


def record_value(record, setting: str) -> tuple[float, str] | None:
    """The lambda a named setting takes from ``record`` (a LambdaRecord) and how to say it, or None for a
    setting that does not read it (zero, max, a literal, direct)."""
    from lara.calibrate.record import setting_tau

    if setting == "star" or setting_tau(setting) is not None:
        return record.lambda_star, f"lambda* = {record.lambda_star:.4g} from {record.path}"
    if setting == "hat":
        return record.lambda_hat, f"lambda-hat = {record.lambda_hat:.4g} from {record.path}"
    if setting in CERTIFIED and setting in (record.get("procedures") or {}):
        lam = record.procedure_lambda(setting)
        return lam, f"the {setting} lambda = {lam:.4g} from {record.path}"
    return None


def expect_decoded_with(artifact: Artifact, record, setting: str, method: str | None = None) -> None:
    """``artifact`` (a decoded output, or its evaluation) is ``method`` at ``setting`` decoded with ``record``:
    its setting, its lambda (the record's value for that setting), the record it names and that record's tau
    and N, each checked where the artifact carries it."""
    if method is not None:
        artifact.expect("method", method)
    got = artifact.field("setting")
    if got is not MISSING and got != setting:
        lam = artifact.field("lambda")
        shown = "" if lam is MISSING else f" (lambda = {float(lam):.4g})"
        want = record_value(record, setting)
        raise DataError(f"{artifact.where}: setting {got}{shown}, expected {setting}"
                        + (f" ({want[1]})" if want else ""))
    want = record_value(record, setting)
    if want is not None:
        artifact.expect("lambda", want[0], want[1], shown=lambda v: f"{float(v):.6g}")
    artifact.expect("lambda_record", file_digest(record.path), f"the digest of {record.path}")
    artifact.expect("tau", record.tau, f"the tau {record.path} was calibrated for")
    if record.decoder_n is not None and artifact.field("method") == "bon":
        artifact.expect("n", record.decoder_n, f"the Best-of-N size {record.path} was calibrated for")


def decoded_identity(kind: str, out, method: str, setting: str, lam: float, record_path=None, **fields) -> dict:
    """The identity of a decoded output: what was decoded, at which lambda, from which record (its digest,
    tau and calibration prompts' digest)."""
    extra = {}
    if record_path is not None and Path(record_path).exists() and setting not in ("zero", "max"):
        rec_id = read_identity(record_path)
        data = json_file(Path(record_path), mapping=False)
        extra = {"lambda_record": file_digest(record_path), "tau": data.get("tau"),
                 "calibration_prompts": (rec_id.get("prompts") or {}).get("digest")}
    return stamp(kind, out, method=method, setting=setting, **{"lambda": float(lam)}, **extra, **fields)


def expect_role(path: str | Path, flag: str, want: str, why: str, found: dict | None = None) -> str | None:
    """The prompt pool a table's identity (``found``, where already read) names (None where it names none):
    ``want``, else refused saying ``why`` (calibrating on the test prompts, or auditing on the calibration prompts,
    answers another question)."""
    role = (read_identity(path) if found is None else found).get("role")
    if role not in (None, want):
        raise DataError(f"{flag} {path}: role {role}, expected {want} ({why})")
    return role


def role_of(path: str | Path) -> str | None:
    """The prompt pool a table belongs to: its identity's role, or the split it was written as (split_role)."""
    found = read_identity(path).get("role")
    if found is None and Path(path).suffix.lower() == ".parquet":
        try:
            found = read_metadata(path).get("split_role")
        except (OSError, ValueError):
            found = None
    return found


def evaluated(responses: str | Path, out: str | Path) -> dict:
    """An evaluation's identity: what it evaluated (the responses' identity), as kind ``evaluation``."""
    made = {k: v for k, v in read_identity(responses).items() if k not in ("kind", "experiment", "made_from")}
    return stamp("evaluation", out, **made, made_from={"--responses": responses})


# ---------------------------------------------------------------------------------------------
# artifacts that combine several: the sweep and the audit against the lambda record read beside them


def check_sweep(sweep: pd.DataFrame, record, where: str, prompts: PromptSet | None = None) -> None:
    """A sweep read beside ``record`` was made with it: its lambda* row at the record's N is the record's lambda*
    and tau, made with the record (its digest) and, with ``prompts``, over the prompts it is compared with: a sweep
    without the columns that say so (lara bon-sweep writes them) is refused, never taken on trust."""
    needed = ["tau", "record"] + (["prompt_set", "n_prompts"] if prompts is not None else [])
    missing = [c for c in needed if c not in sweep.columns]
    if missing:
        raise DataError(f"{where}: no column {', '.join(missing)} (lara bon-sweep writes them): cannot tell which "
                        "record and which prompts it was swept with")
    n = record.decoder_n or int(sweep["n"].max())
    rows = sweep[(sweep["label"] == "lambda_star") & (sweep["n"] == n)]
    if rows.empty:
        raise DataError(f"{where}: no lambda_star row for N = {n}; it was not swept with {record.path}")
    row = rows.iloc[0]
    if not _same(float(row["lambda"]), record.lambda_star):
        raise DataError(f"{where}: lambda* {float(row['lambda']):.6g}, expected {record.lambda_star:.6g} (lambda* from "
                        f"{record.path}): the sweep was made with another calibration")
    if not _same(float(row["tau"]), record.tau):
        raise DataError(f"{where}: tau {float(row['tau']):g}, expected {record.tau:g} (the tau of {record.path})")
    if str(row["record"]) != file_digest(record.path):
        raise DataError(f"{where}: made with lambda record {row['record']}, expected {record.path} "
                        f"({file_digest(record.path)})")
    if prompts is not None and str(row["prompt_set"]) != prompts.digest:
        raise DataError(f"{where}: swept over other test prompts ({int(row['n_prompts'])}) than the audit's "
                        f"({prompts.n})")


def audit_disagreements(audit: dict, record, summary_path: str | Path | None = None) -> list[str]:
    """How a constraint audit disagrees with ``record`` (made with another lambda.json, for another tau or
    lambda*) and with the summary.csv beside it (not the one it wrote); empty when they agree."""
    made = audit.get(KEY) or {}
    problems = []
    if made.get("lambda_record") not in (None, file_digest(record.path)):
        problems.append(f"it was made with another lambda.json (digest {made['lambda_record']}, {record.path}: "
                        f"{file_digest(record.path)})")
    for key, value, now in (("tau", made.get("tau", audit.get("tau")), record.tau),
                            ("lambda_star", audit.get("lambda_star"), record.lambda_star)):
        if isinstance(value, int | float) and not _same(float(value), now):
            problems.append(f"its {key} is {value:g}, {record.path}'s {now:g}")
    if summary_path is not None and made.get("summary") not in (None, file_digest(summary_path)):
        problems.append(f"{summary_path} is not the summary it wrote")
    return problems
