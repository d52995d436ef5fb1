"""Disjoint calibration and test prompt splits from a prompt pool."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from lara.data.ingest import _require, _text, load_source
from lara.data.tables import DataError, write_table
from lara.provenance import code_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitSettings:
    source: str
    split: str = "test"
    column: str = "prompt"
    n_calibration: int = 200
    n_test: int = 64
    seed: int = 0


def prompt_id(text: str) -> str:
    """A stable id from the prompt text, so results can be joined and audited across runs."""
    return "p" + hashlib.sha1(text.encode()).hexdigest()[:12]


def split_prompts(prompts: pd.Series, n_calibration: int, n_test: int, seed: int,
                  source: str = "prompts") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Deduplicate (after whitespace normalisation), shuffle with ``seed`` and cut into two
    disjoint splits of the requested sizes."""
    unique = pd.unique(prompts.map(lambda t: " ".join(t.split())))
    need = n_calibration + n_test
    if len(unique) < need:
        raise DataError(f"{source}: {len(unique)} distinct prompts, but n_calibration + n_test = "
                        f"{n_calibration} + {n_test} = {need} are needed")
    order = np.random.default_rng(seed).permutation(len(unique))
    chosen = unique[order[:need]]
    frame = pd.DataFrame({"prompt_id": [prompt_id(t) for t in chosen], "prompt": chosen})
    return (frame.iloc[:n_calibration].reset_index(drop=True),
            frame.iloc[n_calibration:].reset_index(drop=True))


# ---------------------------------------------------------------------------------------------
# CLI: lara split-prompts

HELP = "draw disjoint calibration and test prompt splits from a prompt pool"


def add_arguments(parser) -> None:
    parser.add_argument("--source", required=True, help="local file/dir or hub dataset id")
    parser.add_argument("--split", default="test")
    parser.add_argument("--column", default="prompt")
    parser.add_argument("--n-calibration", type=int, required=True)
    parser.add_argument("--n-test", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--calibration", required=True, help="output parquet")
    parser.add_argument("--test", required=True, help="output parquet")


def run(args) -> None:
    s = SplitSettings(source=args.source, split=args.split, column=args.column,
                      n_calibration=args.n_calibration, n_test=args.n_test, seed=args.seed)
    raw, origin = load_source(s.source, s.split)
    _require(raw, (s.column,), s.source)
    cal, test = split_prompts(_text(raw, s.column, s.source), s.n_calibration, s.n_test, s.seed, s.source)
    meta = {"settings": asdict(s), "origin": origin, "rows_in": len(raw), "code": code_version()}
    write_table(cal, args.calibration, meta | {"split_role": "calibration"})
    try:
        write_table(test, args.test, meta | {"split_role": "test"})
    except BaseException:
        Path(args.calibration).unlink(missing_ok=True)  # never leave one split without the other
        raise
    log.info("%s: %d rows, %d calibration and %d test prompts", s.source, len(raw), len(cal), len(test))
