"""Ingest Alpaca-schema and PKU-SafeRLHF-schema data from a hub id or a local file.

Every source goes through ``datasets.load_dataset``: a hub id or a local dataset
directory is loaded as it is, a local file through the matching packaged builder
(``json`` for .jsonl/.json, ``parquet``, ``csv``). The rows are then validated and
normalised by the same code whatever their origin, and written atomically as parquet
with a provenance record in the file's metadata.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from lara.hub import (
    HubRef,
    commit_of,
    is_hub_id,
    load_dataset_snapshot,
    revision_setting,
    snapshot,
)
from lara.io import copy_hashed, sha256_path
from lara.provenance import code_version
from lara.read.files import DataError, check_text_file, write_table
from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting
from lara.template import alpaca_user_text

log = logging.getLogger(__name__)

FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}

PREFERENCE_COLUMNS = ("prompt", "response_0", "response_1", "better_response_id",
                      "safer_response_id", "is_response_0_safe", "is_response_1_safe")
HARM_CATEGORY_COLUMNS = ("response_0_harm_category", "response_1_harm_category")  # PKU-SafeRLHF, optional
KINDS = ("sft", "preferences")


@dataclass(frozen=True)
class SourceSettings(Settings):
    """Where a data set is read from (:func:`load_source`): the fields every data step's settings begin with."""

    source: str = setting(help="A local file/dir or hub dataset id (the rule resolves config key source, "
                               "where toy names the toy world's file).", config=False)
    split: str = setting("train", "Dataset split to read.")
    revision: str | None = revision_setting("the dataset")
    name: str | None = setting(None, "The hub dataset's configuration (load_dataset's name; null = its default).")
    data_dir: str | None = setting(None, "A folder of the hub dataset repository to read (load_dataset's data_dir; "
                                         "null = the configuration's files).")


@dataclass(frozen=True)
class IngestSettings(SourceSettings):
    """data.sft: one data set read, validated and normalised."""

    SECTION: ClassVar[str] = "data.sft"

    max_examples: int | None = setting(None, "Keep the first N rows after shuffling (null = all).", minimum=1)
    seed: int = seed_setting()


@dataclass(frozen=True)
class PreferenceIngestSettings(IngestSettings):
    """data.preferences: the safety preference pairs."""

    SECTION: ClassVar[str] = "data.preferences"

    inconsistent: Literal["error", "drop"] = setting(
        "error", "Rows whose safer response is labelled unsafe while the other is safe: fail naming the row "
                 "(error) or drop them and log how many (drop, as Safe-RLHF does).")


SETTINGS = {"sft": IngestSettings, "preferences": PreferenceIngestSettings}


def load_source(source: str, split: str, hub=None) -> tuple[pd.DataFrame, dict]:
    """Load one split of a source as a DataFrame, plus a record of where it came from.

    A local source is read fresh every time: a file is copied (and hashed while copied) into a
    temporary folder and loaded from there with a cache of its own, so the rows are the bytes whose
    sha256 is recorded; the datasets cache (keyed by path and modification time) would return the
    rows of an earlier version of a file edited with its mtime restored. A local dataset folder also
    gets a fresh cache. A hub dataset is read from the snapshot that ``lara fetch`` put in the hub cache
    (lara.hub; ``hub``: the settings with its revision, name and data_dir), never from the network. A local
    folder is read with the configuration ``name`` and ``data_dir`` too; a local file has neither, and nothing
    local has a revision: such a setting is refused, not ignored."""
    import tempfile

    from datasets import load_dataset

    path = Path(source)
    given = {k: getattr(hub, k, None) for k in ("revision", "name", "data_dir")}
    section = getattr(hub, "SECTION", "data")
    if not is_hub_id(source):
        kept = ("name", "data_dir") if path.is_dir() else ()
        for key, value in given.items():
            if value is not None and key not in kept:
                applies = "a hub dataset" if key == "revision" else "a hub dataset or a dataset folder"
                raise DataError(f"{section}.{key}: {value!r} applies to {applies}; {source} is a local "
                                f"{'folder' if path.is_dir() else 'file'}")
    with tempfile.TemporaryDirectory(prefix="lara-ingest-") as tmp:
        cache = {"cache_dir": str(Path(tmp) / "cache")}
        if path.suffix.lower() in FILE_BUILDERS or path.is_file():
            builder = FILE_BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise DataError(f"{source}: unsupported file type {path.suffix!r} "
                                f"(expected one of {', '.join(sorted(FILE_BUILDERS))})")
            if not path.is_file():
                raise DataError(f"{source}: file not found")
            staged = Path(tmp) / f"source{path.suffix.lower()}"
            digest = copy_hashed(path, staged)
            if staged.stat().st_size == 0:
                raise DataError(f"{source}: the file is empty")
            check_text_file(staged, name=source)
            args = dict(path=builder, data_files={split: str(staged)}, **cache)
            origin = {"source": source, "kind": "file", "sha256": digest}
        elif path.is_dir():
            args = dict(path=str(path), name=given["name"], data_dir=given["data_dir"], **cache)
            origin = {"source": source, "kind": "directory", "sha256": sha256_path(path)}
        elif is_hub_id(source):
            key = f"{hub.SECTION}.source" if hub is not None else "--source"
            ref = HubRef(key, source, "dataset", given["revision"], given["name"], given["data_dir"], split)
            folder = snapshot(ref)
            log.info("%s %s: the fetched snapshot %s", ref.key, ref.label, folder)
            ds = load_dataset_snapshot(ref, folder)
            origin = {"source": source, "kind": "hub", "revision": ref.revision, "commit": commit_of(folder),
                      "name": ref.name, "data_dir": ref.data_dir, "split": split,
                      "fingerprint": getattr(ds, "_fingerprint", None)}
            return ds.to_pandas(), origin
        else:
            raise DataError(f"{source}: no such file or directory, and not a hub dataset id (owner/name)")
        try:
            ds = load_dataset(**args, split=split)
        except Exception as exc:  # datasets raises many types (FileNotFound, ConnectionError, ...)
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise DataError(f"{source}: could not load split {split!r}: {msg}") from exc
        origin |= {"split": split, "fingerprint": getattr(ds, "_fingerprint", None)}
        return ds.to_pandas(), origin


STORED_INDEX = re.compile(r"__index_level_\d+__")  # how pyarrow names an unnamed pandas index it stored


def _require(df: pd.DataFrame, columns, source: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        stored = [str(c) for c in df.columns if STORED_INDEX.fullmatch(str(c))]
        hint = (f"; {', '.join(stored)} is a pandas index stored without a name (the file was written with "
                "DataFrame.to_parquet and its index): name the index after the column, or write the column "
                "as a column (reset_index(), index=False)") if stored else ""
        raise DataError(f"{source}: missing column(s) {', '.join(missing)} "
                        f"(found: {', '.join(map(str, df.columns))}){hint}")
    if len(df) == 0:
        raise DataError(f"{source}: no rows")


def _rows(mask: pd.Series | np.ndarray, limit: int = 5) -> str:
    idx = np.flatnonzero(np.asarray(mask))
    shown = ", ".join(str(i) for i in idx[:limit])
    return f"row {shown}" if len(idx) == 1 else f"{len(idx)} rows ({shown}{', ...' if len(idx) > limit else ''})"


def _text(df: pd.DataFrame, column: str, source: str, allow_empty: bool = False) -> pd.Series:
    col = df[column]
    bad = ~col.map(lambda v: isinstance(v, str)).astype(bool)
    if bad.any():
        raise DataError(f"{source}: column {column!r} must hold text; {_rows(bad)} do not")
    col = col.astype(str)
    if not allow_empty:
        empty = col.str.strip() == ""
        if empty.any():
            raise DataError(f"{source}: column {column!r} is empty at {_rows(empty)}")
    return col


def _binary_id(df: pd.DataFrame, column: str, source: str) -> pd.Series:
    values = pd.to_numeric(df[column], errors="coerce")
    bad = ~values.isin([0, 1])
    if bad.any():
        raise DataError(f"{source}: column {column!r} must be 0 or 1; {_rows(bad)} are not")
    return values.astype("int64")


_BOOL = {True: True, False: False, "true": True, "false": False,
         "True": True, "False": False, "1": True, "0": False}


def _bool(df: pd.DataFrame, column: str, source: str) -> pd.Series:
    def conv(v):
        try:
            return _BOOL.get(v.item() if hasattr(v, "item") else v)
        except TypeError:
            return None

    values = df[column].map(conv)
    bad = values.isna()
    if bad.any():
        raise DataError(f"{source}: column {column!r} must be a boolean; {_rows(bad)} are not")
    return values.astype(bool)


def normalise_sft(df: pd.DataFrame, source: str) -> pd.DataFrame:
    """Alpaca schema -> instruction, input, output, prompt (the user turn)."""
    _require(df, ("instruction", "output"), source)
    out = pd.DataFrame({
        "instruction": _text(df, "instruction", source),
        "input": (df["input"].fillna("").astype(str) if "input" in df.columns
                  else pd.Series([""] * len(df), index=df.index)),
        "output": _text(df, "output", source),
    })
    out["prompt"] = [alpaca_user_text(i, x) for i, x in zip(out["instruction"], out["input"], strict=True)]
    return out.reset_index(drop=True)


def _categories(df: pd.DataFrame, column: str, source: str, names: tuple | None) -> tuple[list[dict], tuple]:
    """A per-category label column: every row a mapping of the same category names to booleans."""
    rows = []
    for i, value in enumerate(df[column]):
        if isinstance(value, str) and value.startswith("{"):  # a CSV cell: the mapping written as text
            with contextlib.suppress(ValueError, SyntaxError):
                value = ast.literal_eval(value)
        if not isinstance(value, dict) or not value:
            raise DataError(f"{source}: column {column!r} must map harm categories to booleans; row {i} holds "
                            f"{type(value).__name__} {value!r:.60}")
        keys = tuple(sorted(value))
        if names is None:
            names = keys
        if keys != names:
            raise DataError(f"{source}: column {column!r}: row {i} names the categories {list(keys)}, earlier rows "
                            f"{list(names)}")
        bad = [k for k, v in value.items() if not isinstance(v, (bool, np.bool_))]
        if bad:
            raise DataError(f"{source}: column {column!r}: row {i}: categories {bad} are not booleans")
        rows.append({k: bool(value[k]) for k in names})
    return rows, names


def normalise_preferences(df: pd.DataFrame, source: str, inconsistent: str = "error") -> tuple[pd.DataFrame, int]:
    """PKU-SafeRLHF schema, typed and checked. Returns the table and the rows dropped.

    A row is inconsistent when its safer response is labelled unsafe while the other
    one is labelled safe (Safe-RLHF drops such rows).
    """
    _require(df, PREFERENCE_COLUMNS, source)
    out = pd.DataFrame({c: _text(df, c, source) for c in ("prompt", "response_0", "response_1")})
    for c in ("better_response_id", "safer_response_id"):
        out[c] = _binary_id(df, c, source)
    for c in ("is_response_0_safe", "is_response_1_safe"):
        out[c] = _bool(df, c, source)
    present = [c for c in HARM_CATEGORY_COLUMNS if c in df.columns]
    if present:
        if len(present) == 1:
            missing = next(c for c in HARM_CATEGORY_COLUMNS if c not in present)
            raise DataError(f"{source}: column {present[0]!r} without {missing!r}: the per-category labels "
                            "come in pairs")
        names = None
        for c in HARM_CATEGORY_COLUMNS:
            out[c], names = _categories(df, c, source, names)
    safe = out[["is_response_0_safe", "is_response_1_safe"]].to_numpy()
    rows = np.arange(len(out))
    safer = out["safer_response_id"].to_numpy()
    bad = ~safe[rows, safer] & safe[rows, 1 - safer]
    if bad.any():
        if inconsistent == "error":
            raise DataError(
                f"{source}: column 'safer_response_id' names the unsafe response while the other is "
                f"labelled safe (is_response_*_safe) at {_rows(bad)}; fix the labels or set "
                f"data.preferences.inconsistent: drop")
        log.warning("%s: dropping %d rows whose safer_response_id contradicts is_response_*_safe",
                    source, int(bad.sum()))
        out = out[~bad]
    return out.reset_index(drop=True), int(bad.sum())


def subsample(df: pd.DataFrame, max_examples: int | None, seed: int) -> pd.DataFrame:
    """The first ``max_examples`` rows of a seeded shuffle, kept in their original order."""
    if max_examples is None or max_examples >= len(df):
        return df
    keep = np.sort(np.random.default_rng(seed).permutation(len(df))[:max_examples])
    return df.iloc[keep].reset_index(drop=True)


def ingest(kind: str, s: IngestSettings) -> tuple[pd.DataFrame, dict]:
    """Load, validate and normalise one data set; return it with its provenance record."""
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r}; expected one of {KINDS}")
    raw, origin = load_source(s.source, s.split, hub=s)
    dropped = 0
    if kind == "sft":
        df = normalise_sft(raw, s.source)
    else:
        df, dropped = normalise_preferences(raw, s.source, getattr(s, "inconsistent", "error"))
    if len(df) == 0:
        raise DataError(f"{s.source}: no rows left after validation")
    df = subsample(df, s.max_examples, s.seed)
    meta = {"kind": kind, "settings": asdict(s), "origin": origin, "rows_in": len(raw),
            "rows_dropped": dropped, "rows_out": len(df), "code": code_version()}
    return df, meta


# ---------------------------------------------------------------------------------------------
# CLI: lara prepare-data

HELP = "ingest, validate and normalise Alpaca-schema (sft) or PKU-SafeRLHF-schema (preferences) data"


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--source", required=True, help="local file/dir or hub dataset id")
    add_settings_arguments(parser, PreferenceIngestSettings,
                           section_help="JSON of the config's data.sft or data.preferences section")
    parser.add_argument("--out", required=True, help="output parquet")


def run(args) -> None:
    s = read_settings(args, SETTINGS[args.kind], source=args.source)
    df, meta = ingest(args.kind, s)
    from lara import identity

    write_table(df, args.out, meta | {identity.KEY: identity.stamp(args.kind, args.out)})  # sealed (lara.read)
    log.info("%s: %d rows in, %d dropped, %d written to %s", s.source, meta["rows_in"],
             meta["rows_dropped"], meta["rows_out"], args.out)
