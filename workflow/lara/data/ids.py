"""Identifier columns and the index of a table read from disk: what a reader checks before any row is grouped
(:func:`check_id_types`, :func:`plain_index`)."""

from __future__ import annotations

import re

import pandas as pd

from lara.data.errors import DataError

ID_COLUMNS = ("prompt_id", "sample_id")
_WHOLE = re.compile(r"[+-]?[0-9]+(\.0*)?")


def id_key(value) -> str:
    """What an id becomes once written and read again in any of the workflow's formats: its text, stripped,
    and a whole number without sign, leading zeros or a zero fraction ("01", " 1", "+1", 1, 1.0 and "1" are one
    id; "1.5", "p1" and "P1" are ids of their own)."""
    text = str(value).strip()
    if _WHOLE.fullmatch(text):
        digits = text.lstrip("+-").split(".")[0].lstrip("0") or "0"
        return ("-" if text.startswith("-") and digits != "0" else "") + digits
    return text


def check_id_types(df: pd.DataFrame, path, columns=ID_COLUMNS) -> None:
    """Refuse an id column two of whose distinct ids are one id by :func:`id_key` (ids of mixed types, or spelt
    two ways: the int 1 and the text "1"; "01" and "1", which a CSV reader turns into the same 1; "p1" and "p1 "),
    naming the file, the column and the two ids: they would merge two prompts into one, or split one into two,
    silently, depending on the format the file last went through. A column of one numeric type cannot hold such a
    pair (1 and 1.0 are one value to pandas already); only text and mixed columns are looked at."""
    for col in (c for c in columns if c in df.columns):
        values = df[col]
        if values.dtype.kind in "iufcb":
            continue
        distinct = pd.Series(pd.unique(values.dropna()), dtype=object)
        keys = distinct.map(id_key)
        twice = keys.duplicated(keep=False).to_numpy()
        if twice.any():
            first = keys[twice].iloc[0]
            a, b = distinct[(keys == first).to_numpy()].tolist()[:2]
            types = f" ({type(a).__name__} and {type(b).__name__})" if type(a) is not type(b) else ""
            raise DataError(f"{path}: column {col!r} holds the ids {a!r} and {b!r}{types}, which are one id once the "
                            "table is written and read again; give every id one type and one spelling")


def plain_index(df: pd.DataFrame, path) -> pd.DataFrame:
    """``df`` with the index a writer stored (``DataFrame.to_parquet`` with an index) undone: named index
    levels become columns again, unnamed ones are dropped, rows are numbered from 0. ``pd.read_parquet`` brings such
    an index back as the frame's index, not as a column (``__index_level_0__`` where it had no name): a
    ``prompt_id`` set as the index would be "missing", and a sliced frame's index would make row labels differ from
    positions. A named level whose name is also a column is refused (which one holds the data?)."""
    index = df.index
    if isinstance(index, pd.RangeIndex) and index.name is None:
        return df if index.start == 0 and index.step == 1 else df.reset_index(drop=True)
    names = [n for n in index.names if n is not None]
    clash = [n for n in names if n in df.columns]
    if clash:
        raise DataError(f"{path}: the stored pandas index {clash[0]!r} has the name of a column too; write the file "
                        "with index=False (or reset_index() before writing)")
    if not names:
        return df.reset_index(drop=True)
    unnamed = [i for i, n in enumerate(index.names) if n is None]
    out = df.reset_index(level=unnamed, drop=True) if unnamed else df
    return out.reset_index()
