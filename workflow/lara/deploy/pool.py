"""``lara deployment-pool``: the deployment prompt pool, one row per distinct prompt with its stratum.

The pool is what the shift scenarios draw their streams from (lara.deploy.stream). A prompt that is also a
calibration prompt is refused: the shift check compares calibration prompts with deployment prompts as two
samples, and a prompt in both would be one prompt counted on both sides.
"""

from __future__ import annotations

import logging
from dataclasses import asdict

import pandas as pd

from lara.data.errors import DataError
from lara.deploy.settings import STRATA, PoolSettings
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "the deployment prompt pool (prompt_id, prompt, stratum), disjoint from the calibration prompts"
OUTPUTS = ("out",)


def add_arguments(parser) -> None:
    add_settings_arguments(parser, PoolSettings)
    parser.add_argument("--source", required=True, help="the pool: a local file or dataset folder, or a hub id")
    parser.add_argument("--calibration", required=True, help="the calibration prompts (no pool prompt may be one)")
    parser.add_argument("--out", required=True, help="output parquet: prompt_id, prompt, stratum")


def pool_table(raw: pd.DataFrame, s: PoolSettings, source: str) -> pd.DataFrame:
    """The distinct prompts of ``raw`` with their strata (a prompt given twice must keep one stratum)."""
    from lara.data.ingest import _require, _text
    from lara.data.splits import _normalise, prompt_id
    from lara.data.text import prompt_key

    _require(raw, (s.column, s.stratum_column), source)
    text = _normalise(_text(raw, s.column, source))
    stratum = _text(raw, s.stratum_column, source).str.strip()
    bad = ~stratum.isin(STRATA)
    if bad.any():
        i = int(bad.to_numpy().nonzero()[0][0])
        raise DataError(f"{source}: column {s.stratum_column!r} row {i} holds {stratum.iloc[i]!r}; a stratum is one "
                        f"of {', '.join(STRATA)}")
    frame = pd.DataFrame({"key": text.map(prompt_key), "prompt": text, "stratum": stratum.to_numpy()})
    strata = frame.groupby("key")["stratum"].nunique()
    if (strata > 1).any():
        key = strata[strata > 1].index[0]
        raise DataError(f"{source}: the prompt {key[:80]!r} is given with two strata "
                        f"({', '.join(sorted(frame.loc[frame.key == key, 'stratum'].unique()))})")
    frame = frame.drop_duplicates("key").reset_index(drop=True)
    if not frame["stratum"].isin(("benign", "harmful")).any():
        raise DataError(f"{source}: no benign or harmful prompt; every scenario draws from them")
    return pd.DataFrame({"prompt_id": frame["key"].map(prompt_id), "prompt": frame["prompt"],
                         "stratum": frame["stratum"]})


def run(args) -> None:
    from lara import identity
    from lara.data.ingest import load_source
    from lara.data.text import prompt_key
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, PoolSettings, source=args.source)
    raw, origin = load_source(s.source, s.split, hub=s)
    pool = pool_table(raw, s, s.source)
    calibration = read_table(args.calibration, required=("prompt_id", "prompt"))
    both = pool["prompt"].map(prompt_key).isin(set(calibration["prompt"].map(prompt_key)))
    if both.any():
        raise DataError(f"{s.source}: {int(both.sum())} deployment prompt(s) are calibration prompts of "
                        f"{args.calibration}, e.g. {pool.loc[both, 'prompt'].iloc[0][:80]!r}; the pool must be "
                        "disjoint from them")
    counts = pool["stratum"].value_counts().to_dict()
    made = identity.stamp("prompts", args.out, role="deployment", prompts=identity.prompt_set(pool, args.out).record(),
                          strata=counts, made_from={"--calibration": args.calibration})
    write_table(pool, args.out, {"settings": asdict(s), "origin": origin, "split_role": "deployment",
                                 "code": code_version(), identity.KEY: made})
    log.info("%s: %d deployment prompts (%s)", s.source, len(pool),
             ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
