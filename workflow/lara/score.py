"""``lara score``: add reward and cost columns to a table of sampled responses through the scorer
interface (the trained reward/cost models, or any named scorer).

Not to be confused with ``lara.scoring`` (the scorer interface and its backends, used by every
step that scores) or ``lara.toy.score`` (the toy world's oracle as a named scorer, and
``lara oracle-score``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from lara.settings import Dtype, Settings, add_settings_arguments, dtype_setting, read_settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoreSettings(Settings):
    """What scoring reads from the config: the weight dtype of the scorer models."""

    dtype: Dtype = dtype_setting()

HELP = "score responses with reward and cost scorers (model directories or 'oracle')"


def add_arguments(parser) -> None:
    parser.add_argument("--input", required=True, help="parquet with prompt and response columns")
    parser.add_argument("--reward", required=True, help="reward scorer: model directory or 'oracle'")
    parser.add_argument("--cost", required=True, help="cost scorer: model directory or 'oracle'")
    parser.add_argument("--batch-size", type=int, default=32)
    add_settings_arguments(parser, ScoreSettings)
    parser.add_argument("--out", required=True, help="output parquet (input columns + reward, cost)")


def run(args) -> None:
    s = read_settings(args, ScoreSettings)
    score_and_write(args, s, "scores", [("reward", args.reward, "reward"), ("cost", args.cost, "cost")],
                    {"reward_scorer": args.reward, "cost_scorer": args.cost},
                    {"reward": args.reward, "cost": args.cost})


def score_and_write(args, s: ScoreSettings, kind: str, jobs, stamp: dict, meta: dict) -> None:
    """Add a column per job (``(column, scorer spec, role)``) to ``--input`` and write it to ``--out``, stamped ``kind``
    (the input's role and prompts, then ``stamp``) with ``meta`` in its metadata: the one scoring loop of lara score
    and lara score-constraints. A scorer giving a non-finite score is refused, naming it."""
    from lara import identity
    from lara.provenance import code_version
    from lara.read.files import DataError, read_table, write_table
    from lara.scoring import load_scorer, score_table

    df = read_table(args.input, text=("prompt", "response"))
    for col, spec, role in jobs:
        scorer = load_scorer(spec, role=role, batch_size=args.batch_size, dtype=s.dtype)
        log.info("scoring %d responses for %s with %s", len(df), col, spec)
        df[col] = score_table(scorer, df["prompt"].tolist(), df["response"].tolist(), f"scoring {col}")
        if not np.all(np.isfinite(df[col])):
            raise DataError(f"{spec}: produced non-finite {col} scores")
        log.info("%s: mean %.4f, std %.4f", col, df[col].mean(), df[col].std())
    made = identity.stamp(kind, args.out, **identity.inherit(identity.read_identity(args.input), "role", "per_prompt",
                                                             "prompts"), **stamp, made_from={"--input": args.input})
    write_table(df, args.out, {"input": args.input, **meta, "code": code_version(), identity.KEY: made})
