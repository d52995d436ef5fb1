"""The file formats of the one reader (:mod:`lara.read`): tables (parquet, CSV, JSON Lines), JSON records and
their one-line errors, and the atomic table writer."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from lara.io import atomic_output, record_seal
from lara.read.jsontext import no_duplicate_keys
from lara.read.yamlfile import JSON_FILE, readable

# ids are text in every format: a CSV or JSON reader guessing types would make "01" the number 1 (and one prompt of
# "01" and "1"); JSON keeps the types it wrote (1 and "1" are then refused as one id spelt two ways)
_TEXT_IDS, _RAW_IDS = {"prompt_id": str}, {"prompt_id": object}
READERS = {".parquet": pd.read_parquet, ".csv": lambda p: pd.read_csv(p, dtype=_TEXT_IDS, keep_default_na=False,
                                                                       na_values=[""]),
           ".jsonl": lambda p: pd.read_json(p, lines=True, dtype=_RAW_IDS),
           ".json": lambda p: pd.read_json(p, dtype=_RAW_IDS)}


from lara.data.errors import DataError  # noqa: E402  (re-exported: steps import it from here)

TEXT_SUFFIXES = (".jsonl", ".json", ".csv", ".tsv")


def check_text_file(path: str | Path, name: str | None = None) -> None:
    """A text data file must be UTF-8, and a JSON Lines file one JSON object per line: the first
    line that is not is a :class:`DataError` naming the file (``name``, if the bytes were copied
    from it) and the line (the readers below would name neither, or fail inside pyarrow)."""
    path = Path(path)
    name = name or str(path)
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES:
        return
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{name}: line {number} is not UTF-8 (byte 0x{raw[exc.start]:02x} at column "
                                f"{exc.start + 1}); re-encode the file as UTF-8") from None
            if suffix in (".csv", ".tsv") and number == 1:  # a column named twice: the reader would rename one
                import csv

                header = next(csv.reader([line.lstrip("\ufeff")], delimiter="," if suffix == ".csv" else "\t"), [])
                twice = sorted({c for c in header if header.count(c) > 1})
                if twice:
                    raise DataError(f"{name}: the column {twice[0]!r} is named twice in the header; the reader would "
                                    "rename the second and one of them would be read for the other")
            if suffix == ".jsonl" and line.strip():
                try:
                    row = json.loads(line, object_pairs_hook=no_duplicate_keys(f"{name}: line {number}", DataError))
                except DataError:
                    raise
                except ValueError as exc:
                    raise DataError(f"{name}: line {number} is not valid JSON ({exc})") from None
                if not isinstance(row, dict):
                    raise DataError(f"{name}: line {number} is not a JSON object (one record per line)")


_READ: dict[tuple, pd.DataFrame] = {}  # this command's tables, read once (lara.cli.main empties it per command)


def forget() -> None:
    """Forget the tables read so far (a new command starts reading afresh)."""
    _READ.clear()


def _stat_key(path: Path) -> tuple | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns)


def _load(path: Path, where: str) -> pd.DataFrame:
    key = _stat_key(path)
    if key is not None and key in _READ:
        return _READ[key].copy()
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(f"{where}: unsupported file type {path.suffix!r} "
                        f"(expected one of {', '.join(sorted(READERS))})")
    if path.is_dir():
        raise DataError(f"{where}: is a folder, expected a file")
    if not path.is_file():
        raise DataError(f"{where}: file not found")
    check_text_file(path, where)
    try:
        df = reader(path)
    except (ValueError, OSError) as exc:
        text = " ".join(str(exc).split())[:200]
        raise DataError(f"{where}: could not be read: {text}") from None
    from lara.data.ids import check_id_types, plain_index

    if path.suffix.lower() == ".parquet":
        check_rows(df, path, where)
    df = plain_index(df, where)  # a pandas index stored by the writer is a column again (or dropped), never the rows
    check_ids(df, where)
    check_id_types(df, where)
    df = text_ids(df)
    if key is not None:
        _READ[key] = df
    return df.copy()


def text_ids(df: pd.DataFrame) -> pd.DataFrame:
    """``prompt_id`` as text in every format (a parquet file of integer ids reads as "1", "2", ...)."""
    if "prompt_id" in df.columns and df["prompt_id"].map(lambda v: not isinstance(v, str)).any():
        from lara.data.ids import id_key

        df = df.assign(prompt_id=df["prompt_id"].map(lambda v: v if isinstance(v, str) else id_key(v)))
    return df


def read_table(path: str | Path, required: list[str] | tuple[str, ...] = (), where: str | None = None,
               text: tuple[str, ...] = ()) -> pd.DataFrame:
    """A table, read once per command (a second read of the same unchanged file is a copy of the first): its
    format's errors, stored index, ids (present, text, one spelling) checked, ``required`` columns present, and a
    string in every row of the ``text`` columns (a prompt or response a scorer reads: a missing one would be scored
    as the text "None")."""
    path = Path(path)
    where = where or str(path)
    df = _load(path, where)
    missing = [c for c in (*required, *text) if c not in df.columns]
    if missing:
        raise DataError(f"{where}: missing column(s) {', '.join(dict.fromkeys(missing))} "
                        f"(found: {', '.join(map(str, df.columns))})")
    for col in text:
        bad = ~df[col].map(lambda v: isinstance(v, str)).to_numpy(dtype=bool)
        if bad.any():
            raise DataError(f"{where}: column {col}: {_rows(bad)} hold no text (missing, or not a string)")
    return df


ID_COLUMNS = ("prompt_id", "sample_id")  # what rows are grouped and matched by: never missing, never a float


def _rows(mask, limit: int = 5) -> str:
    import numpy as np

    rows = np.flatnonzero(np.asarray(mask))
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows[:limit]))}{more}"


def check_ids(df: pd.DataFrame, path) -> None:
    """The identifier columns of a table (``prompt_id``, ``sample_id``) hold a value in every row: a
    missing id (NaN, None, empty) would be grouped into one extra prompt, or break a reshape; a
    ``sample_id`` is a whole number."""
    import numpy as np

    for col in (c for c in ID_COLUMNS if c in df.columns):
        values = df[col]
        absent = values.isna().to_numpy() | values.astype(str).str.strip().eq("").to_numpy()
        numbers = pd.to_numeric(values, errors="coerce") if values.dtype.kind in "fc" else None
        if numbers is not None:  # a float id column: an infinity is no id either
            absent |= ~np.isfinite(numbers.to_numpy(dtype=float))
        if absent.any():
            raise DataError(f"{path}: column {col!r} has no value (missing, empty or infinite) at {_rows(absent)} "
                            f"(every row names its {col.removesuffix('_id')}); fix or drop those rows")
        if col == "sample_id":
            numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=float)
            bad = ~np.isfinite(numbers) | (numbers != np.round(numbers))
            if bad.any():
                first = int(np.flatnonzero(bad)[0])
                raise DataError(f"{path}: column 'sample_id' holds {values.iloc[first]!r} at {_rows(bad)}; "
                                "a sample id is a whole number")


def write_table(df: pd.DataFrame, path: str | Path, metadata: dict | None = None) -> None:
    """Write atomically; parquet files carry ``metadata`` under the key ``lara``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    with atomic_output(path) as tmp:
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            table = pa.Table.from_pandas(df, preserve_index=False)
            if metadata is not None:
                if isinstance(metadata.get("identity"), dict):  # sealed: an edit of its rows or metadata is refused
                    metadata = json.loads(json.dumps(metadata, default=str))
                    metadata["identity"]["rows"] = rows_digest(table.to_pandas())
                    metadata["identity"]["seal"] = record_seal(metadata)
                meta = dict(table.schema.metadata or {})
                meta[b"lara"] = json.dumps(metadata, default=str).encode()
                table = table.replace_schema_metadata(meta)
            pq.write_table(table, tmp)
        elif suffix == ".csv":
            df.to_csv(tmp, index=False)
        elif suffix == ".jsonl":
            df.to_json(tmp, orient="records", lines=True)
        else:
            raise DataError(f"{path}: unsupported output type {suffix!r}")


def read_metadata(path: str | Path) -> dict:
    """The ``lara`` metadata record of a parquet file written by :func:`write_table`."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return json.loads(meta[b"lara"]) if b"lara" in meta else {}


def require_rows(df: pd.DataFrame, path) -> pd.DataFrame:
    """A table that must hold at least one row (an empty one would give an empty or NaN result)."""
    if df.empty:
        raise DataError(f"{path}: the table has no rows")
    return df


def require_finite(df: pd.DataFrame, columns, path) -> pd.DataFrame:
    """Numeric columns whose every value is a finite number: the first that is not is named with its
    column and rows (and prompt, where the table has prompt ids)."""
    import numpy as np

    for col in columns:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
        bad = ~np.isfinite(values)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            value = df[col].iloc[first]
            shown = repr(value) if isinstance(value, str) else str(value)
            prompt = f" (prompt {df['prompt_id'].iloc[first]!r})" if "prompt_id" in df.columns else ""
            raise DataError(f"{path}: column {col!r} holds {shown}, not a finite number, at "
                            f"{_rows(bad)}{prompt}")
    return df


SCORE_LIMIT = 1e150  # |score| beyond it: r - lambda c, its squares and the soft mode's exponentials overflow


def require_in_range(df: pd.DataFrame, columns, path) -> pd.DataFrame:
    """Finite scores the calibration and selection can compute with: within +-SCORE_LIMIT (1e308 is finite, but
    r - lambda c of it is not); the first that is not is named at the input, with its column and rows (NaN and
    infinities are the finiteness checks' to name)."""
    import numpy as np

    for col in columns:
        values = pd.to_numeric(df[col], errors="coerce").to_numpy(dtype=float)
        bad = np.isfinite(values) & (np.abs(values) > SCORE_LIMIT)
        if bad.any():
            first = int(np.flatnonzero(bad)[0])
            raise DataError(f"{path}: column {col!r} holds {values[first]:g} at {_rows(bad)}, beyond +-{SCORE_LIMIT:g} "
                            "where r - lambda c and its exponentials overflow; rescale the scores")
    return df


class UnreadableJSON(DataError):
    """A JSON file whose text does not parse (a caller may say what the file should have been)."""


def nonfinite_path(data, prefix: str = "") -> str | None:
    """The first key path (``a.b[2]``) of a value that is NaN or infinite, or None."""
    import math

    if isinstance(data, float) and not math.isfinite(data):
        return prefix or "(the document)"
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for key, value in items:
        found = nonfinite_path(value, f"{prefix}.{key}" if isinstance(key, str) and prefix else
                               key if isinstance(key, str) else f"{prefix}[{key}]")
        if found:
            return found
    return None


def parse_json(text: str, where: str, finite: bool = True):
    """JSON text (a record, a sidecar, a command-line value): duplicate keys and NaN/Infinity refused, naming
    ``where``."""
    try:
        data = json.loads(text, object_pairs_hook=no_duplicate_keys(where, DataError))
    except RecursionError:
        raise DataError(f"{where}: nested too deeply to read") from None
    except ValueError as exc:
        if isinstance(exc, DataError):
            raise
        raise UnreadableJSON(f"{where}: not a readable JSON file ({exc})") from None
    bad = nonfinite_path(data) if finite else None
    if bad:
        raise DataError(f"{where}: {bad}: not a finite number (NaN or infinite: never a result)")
    return data


def check_seal(data, where: str) -> None:
    """A record that states what it is (an identity with a kind) holds what its step wrote: sealed, and unedited."""
    made = data.get("identity") if isinstance(data, dict) else None
    if isinstance(made, dict) and made.get("kind") is not None and made.get("seal") is None:
        raise DataError(f"{where}: states what it is (a {made['kind']}) but carries no seal: a record a step wrote "
                        "is sealed, so its seal was removed (or it was written before seals existed); rerun the step "
                        "that makes it, or drop its identity to hand it in as your own record")
    if isinstance(made, dict) and made.get("seal") is not None and made["seal"] != record_seal(data):
        raise DataError(f"{where}: its content is not what its step wrote (a {made.get('kind', 'record')} edited by "
                        "hand: any field, however consistent with the others); rerun the step that makes it")


def json_file(path: str | Path, where: str | None = None, mapping: bool = True, finite: bool = True):
    """A JSON file's content (a mapping unless ``mapping`` is False), or one :class:`DataError` line naming it."""
    path = Path(path)
    where = where or str(path)
    with readable(where, JSON_FILE):
        text = path.read_text(encoding="utf-8")
    data = parse_json(text, where, finite)
    check_seal(data, where)
    if mapping and not isinstance(data, dict):
        raise DataError(f"{where}: the top level must be a JSON object, got {type(data).__name__}")
    return data


def _cell(value) -> str:
    if hasattr(value, "tolist"):
        value = value.tolist()
    return json.dumps(value, sort_keys=True, default=str)


def rows_digest(df: pd.DataFrame) -> str:
    """A digest of a table's rows (columns, order and values) as they read back from parquet."""
    import hashlib

    h = hashlib.sha256("\0".join(map(str, df.columns)).encode())
    for col in df.columns:
        values = df[col]
        try:
            hashed = pd.util.hash_pandas_object(values, index=False).to_numpy()
        except TypeError:  # lists, dicts: their JSON text
            hashed = pd.util.hash_pandas_object(values.map(_cell), index=False).to_numpy()
        h.update(hashed.tobytes())
    return h.hexdigest()[:16]


def check_rows(df: pd.DataFrame, path: Path, where: str) -> None:
    """A sealed table holds the rows and metadata its step wrote: a row added, copied under a new id, removed or
    changed, or its identity or summary edited (a relabelled scenario, a raised min_ess, a lowered certificate),
    with the rest kept, is refused."""
    meta = read_metadata(path)
    made = meta.get("identity") or {}
    kind = made.get("kind", "table")
    if made.get("kind") is not None and (made.get("seal") is None or made.get("rows") is None):
        raise DataError(f"{where}: states what it is (a {kind}) but carries no seal of its rows and metadata: a table "
                        "a step wrote is sealed, so its seal was removed (or it was written before seals existed); "
                        "rerun the step that makes it, or strip its identity to hand it in as your own table")
    if made["seal"] != record_seal(meta) if made.get("seal") is not None else False:
        raise DataError(f"{where}: its metadata is not what its writer wrote (the {kind}'s identity or summary was "
                        "edited after it was written); rerun the step that makes it")
    if made.get("rows") is not None and made["rows"] != rows_digest(df):
        raise DataError(f"{where}: its rows are not the rows its writer wrote (the {kind} was edited after it was "
                        "written: a row added, copied under a new id, removed, changed or reordered, or a column's "
                        "type changed); rerun the step that makes it, or strip its identity to hand it in as your own "
                        "table")
