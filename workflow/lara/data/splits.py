"""Disjoint calibration and test prompt splits.

By default both come from one prompt pool (deduplicated, shuffled, cut in two). With
``--calibration-preferences`` the calibration prompts come instead from the preference data (the
reward and cost models' *training* partition, as in the paper: PKU-SafeRLHF train prompts) and the
test prompts from the pool; calibration then excludes every prompt of the test pool and every
prompt of the reward/cost models' held-out evaluation pairs (``--exclude-held-out FRACTION:SEED``,
the trainers' own split), so no prompt the results are judged on is calibrated on.
"""

from __future__ import annotations

import hashlib
import logging
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from lara.data.ingest import SourceSettings, _require, _text, load_source
from lara.data.text import prompt_key
from lara.provenance import code_version
from lara.read.files import DataError, write_table
from lara.settings import add_settings_arguments, new_default, read_settings, seed_setting, setting

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SplitSettings(SourceSettings):
    """data.prompts: the calibration and test prompt splits."""

    SECTION: ClassVar[str] = "data.prompts"

    split: str = new_default(SourceSettings, "split", "test")
    column: str = setting("prompt", "Column holding the prompt text.")
    n_calibration: int = setting(200, "Calibration prompts (N).", minimum=1)
    n_test: int = setting(256, "Test prompts (the paper uses 256).", minimum=1)
    seed: int = seed_setting()


def prompt_id(text: str) -> str:
    """A stable id from the prompt text, so results can be joined and audited across runs."""
    return "p" + hashlib.sha1(text.encode()).hexdigest()[:12]


def _normalise(texts) -> pd.Series:
    """Prompt texts as stored: Unicode NFC, whitespace runs collapsed to one space."""
    return pd.Series(list(texts), dtype=object).map(lambda t: " ".join(unicodedata.normalize("NFC", str(t)).split()))


def distinct_prompts(texts) -> tuple[np.ndarray, list[str]]:
    """The first of each set of equivalent prompts (as stored), and their keys."""
    texts = _normalise(texts)
    keys = texts.map(prompt_key)
    first = ~keys.duplicated()
    return texts[first].to_numpy(), keys[first].tolist()


def split_prompts(prompts: pd.Series, n_calibration: int, n_test: int, seed: int,
                  source: str = "prompts") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Deduplicate (prompts equal under :func:`prompt_key` are one prompt), shuffle with ``seed`` and
    cut into two disjoint splits of the requested sizes."""
    unique, keys = distinct_prompts(prompts)
    if n_calibration < 0 or n_test < 0:
        raise DataError(f"{source}: n_calibration and n_test must be >= 0, got {n_calibration} and {n_test}")
    need = n_calibration + n_test
    if len(unique) < need:
        raise DataError(f"{source}: {len(unique)} distinct prompts, but n_calibration + n_test = "
                        f"{n_calibration} + {n_test} = {need} are needed")
    order = np.random.default_rng(seed).permutation(len(unique))[:need]
    frame = pd.DataFrame({"prompt_id": [prompt_id(keys[i]) for i in order], "prompt": unique[order]})
    return (frame.iloc[:n_calibration].reset_index(drop=True),
            frame.iloc[n_calibration:].reset_index(drop=True))


def held_out_pair_prompts(preferences: pd.DataFrame, held_out: list[tuple[float, int]]) -> set[str]:
    """Prompts of the preference pairs that the reward/cost trainers hold out for evaluation: their
    split is a seeded permutation of the pair rows (``lara.train.common.split_eval``)."""
    from lara.train.common import split_eval

    out: set[str] = set()
    for fraction, seed in held_out:
        _, evaluation = split_eval(preferences[["prompt"]].reset_index(drop=True), fraction, seed)
        out |= set(_normalise(evaluation["prompt"]).map(prompt_key))
    return out


def split_from_training(pool: pd.Series, preferences: pd.DataFrame, n_calibration: int, n_test: int, seed: int,
                        held_out: list[tuple[float, int]], source: str = "prompts",
                        preferences_source: str = "preferences") -> tuple[pd.DataFrame, pd.DataFrame]:
    """Test prompts from ``pool``; calibration prompts from the preference data's prompts, minus the
    whole test pool and the held-out evaluation pairs' prompts."""
    _, test = split_prompts(pool, 0, n_test, seed, source)
    banned = set(_normalise(pool).map(prompt_key)) | held_out_pair_prompts(preferences, held_out)
    texts, keys = distinct_prompts(preferences["prompt"])
    candidates = pd.Series([t for t, k in zip(texts, keys, strict=True) if k not in banned], dtype=object)
    if len(candidates) < n_calibration:
        raise DataError(f"{preferences_source}: {len(candidates)} training prompts outside the test pool and the "
                        f"held-out evaluation pairs, but n_calibration = {n_calibration} are needed")
    cal, _ = split_prompts(candidates, n_calibration, 0, seed + 1, preferences_source)
    return cal, test


# ---------------------------------------------------------------------------------------------
# CLI: lara split-prompts

HELP = "draw disjoint calibration and test prompt splits from a prompt pool"


OUTPUTS = ("calibration", "test")  # the files this step writes (checked before it computes: lara.cli.check_outputs)


def add_arguments(parser) -> None:
    parser.add_argument("--source", required=True, help="local file/dir or hub dataset id")
    add_settings_arguments(parser, SplitSettings)
    parser.add_argument("--calibration-preferences", default=None,
                        help="draw the calibration prompts from this preference data (parquet) instead of the pool")
    parser.add_argument("--exclude-held-out", nargs="*", default=[], metavar="FRACTION:SEED",
                        help="with --calibration-preferences: the reward/cost trainers' eval_fraction and seed, "
                        "whose held-out pairs' prompts are never calibration prompts")
    parser.add_argument("--calibration", required=True, help="output parquet")
    parser.add_argument("--test", required=True, help="output parquet")


def run(args) -> None:
    s = read_settings(args, SplitSettings, source=args.source)
    raw, origin = load_source(s.source, s.split, hub=s)
    _require(raw, (s.column,), s.source)
    pool = _text(raw, s.column, s.source)
    meta = {"settings": asdict(s), "origin": origin, "rows_in": len(raw), "code": code_version()}
    if args.calibration_preferences:
        from lara.read.files import read_table

        prefs = read_table(args.calibration_preferences, required=("prompt",))
        try:
            held_out = [(float(f), int(sd)) for f, sd in (x.split(":") for x in args.exclude_held_out)]
        except ValueError:
            raise DataError(f"--exclude-held-out {args.exclude_held_out}: expected FRACTION:SEED pairs") from None
        cal, test = split_from_training(pool, prefs, s.n_calibration, s.n_test, s.seed, held_out, s.source,
                                        args.calibration_preferences)
        meta |= {"calibration_from": args.calibration_preferences, "excluded_held_out": held_out}
    else:
        cal, test = split_prompts(pool, s.n_calibration, s.n_test, s.seed, s.source)
    from lara import identity

    def sealed(role: str, out) -> dict:  # what the split is, sealed against edits (lara.read.files)
        return meta | {"split_role": role, identity.KEY: identity.stamp("prompts", out, role=role)}

    write_table(cal, args.calibration, sealed("calibration", args.calibration))
    try:
        write_table(test, args.test, sealed("test", args.test))
    except BaseException:
        Path(args.calibration).unlink(missing_ok=True)  # never leave one split without the other
        raise
    log.info("%s: %d rows, %d calibration and %d test prompts", s.source, len(raw), len(cal), len(test))
