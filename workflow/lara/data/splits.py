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
    n_selection: int = setting(0, "Selection prompts: a third split, disjoint from both, on which the token-budget "
                                  "chooser picks its decoder (decode.budget; docs/budget.md). Drawn after the test "
                                  "prompts from the same shuffle, so the calibration and test splits do not depend "
                                  "on it.", minimum=0)
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
                  source: str = "prompts", n_selection: int = 0) -> tuple[pd.DataFrame, ...]:
    """Deduplicate (prompts equal under :func:`prompt_key` are one prompt), shuffle with ``seed`` and
    cut into disjoint splits of the requested sizes: (calibration, test), and the selection split after them when
    ``n_selection`` is positive (the first two are the same either way)."""
    unique, keys = distinct_prompts(prompts)
    if min(n_calibration, n_test, n_selection) < 0:
        raise DataError(f"{source}: n_calibration, n_test and n_selection must be >= 0, got {n_calibration}, "
                        f"{n_test} and {n_selection}")
    need = n_calibration + n_test + n_selection
    if len(unique) < need:
        sizes = (n_calibration, n_test) + ((n_selection,) if n_selection else ())
        names = " + ".join(("n_calibration", "n_test", "n_selection")[:len(sizes)])
        raise DataError(f"{source}: {len(unique)} distinct prompts, but {names} = "
                        f"{' + '.join(map(str, sizes))} = {need} are needed")
    order = np.random.default_rng(seed).permutation(len(unique))[:need]
    frame = pd.DataFrame({"prompt_id": [prompt_id(keys[i]) for i in order], "prompt": unique[order]})
    cuts = np.cumsum([0, n_calibration, n_test, n_selection])
    parts = tuple(frame.iloc[a:b].reset_index(drop=True) for a, b in zip(cuts, cuts[1:], strict=False))
    return parts if n_selection else parts[:2]


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
                        preferences_source: str = "preferences", n_selection: int = 0) -> tuple[pd.DataFrame, ...]:
    """Test (and selection) prompts from ``pool``; calibration prompts from the preference data's prompts, minus the
    whole test pool and the held-out evaluation pairs' prompts."""
    _, test, *selection = split_prompts(pool, 0, n_test, seed, source, n_selection)
    banned = set(_normalise(pool).map(prompt_key)) | held_out_pair_prompts(preferences, held_out)
    texts, keys = distinct_prompts(preferences["prompt"])
    candidates = pd.Series([t for t, k in zip(texts, keys, strict=True) if k not in banned], dtype=object)
    if len(candidates) < n_calibration:
        raise DataError(f"{preferences_source}: {len(candidates)} training prompts outside the test pool and the "
                        f"held-out evaluation pairs, but n_calibration = {n_calibration} are needed")
    cal, _ = split_prompts(candidates, n_calibration, 0, seed + 1, preferences_source)
    return cal, test, *selection


# ---------------------------------------------------------------------------------------------
# CLI: lara split-prompts

HELP = "draw disjoint calibration and test prompt splits from a prompt pool"


# the files this step writes (checked before it computes: lara.cli.check_outputs)
OUTPUTS = ("calibration", "test", "selection")


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
    parser.add_argument("--selection", default=None,
                        help="output parquet of the selection prompts (needed when data.prompts.n_selection > 0)")


def run(args) -> None:
    s = read_settings(args, SplitSettings, source=args.source)
    if s.n_selection and not args.selection:
        from lara.settings import ConfigError

        raise ConfigError(f"data.prompts.n_selection is {s.n_selection}: name its output with --selection")
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
        cal, test, *selection = split_from_training(pool, prefs, s.n_calibration, s.n_test, s.seed, held_out,
                                                    s.source, args.calibration_preferences, s.n_selection)
        meta |= {"calibration_from": args.calibration_preferences, "excluded_held_out": held_out}
    else:
        cal, test, *selection = split_prompts(pool, s.n_calibration, s.n_test, s.seed, s.source, s.n_selection)
    from lara import identity

    def sealed(role: str, out) -> dict:  # what the split is, sealed against edits (lara.read.files)
        return meta | {"split_role": role, identity.KEY: identity.stamp("prompts", out, role=role)}

    written = [(cal, args.calibration, "calibration"), (test, args.test, "test")]
    if args.selection:  # n_selection 0: an empty selection split (no chooser reads it)
        written.append((selection[0] if selection else test.iloc[:0], args.selection, "selection"))
    done = []
    try:
        for frame, out, role in written:
            write_table(frame, out, sealed(role, out))
            done.append(out)
    except BaseException:
        for out in done:
            Path(out).unlink(missing_ok=True)  # never leave one split without the others
        raise
    log.info("%s: %d rows, %d calibration, %d test and %d selection prompts", s.source, len(raw), len(cal), len(test),
             len(selection[0]) if selection else 0)
