"""``lara bon-prune-sweep``: pruned Best-of-N (``decode.bon_prune``) on the test prompts' N candidates at every lambda
of decode.lambda_grid and at its own calibrated lambdas (lambda-hat, lambda*, the certified ones), with the held-out
verdict and the tokens generated against full Best-of-N's: the pruned decoder's curve in Fig. 1."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from lara.calibrate.pruned import Scheduled
from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting

log = logging.getLogger(__name__)

HELP = "pruned Best-of-N (decode.bon_prune) on the test candidates at every lambda, with tokens and verdicts"


@dataclass(frozen=True)
class PruneSweepSettings(Scheduled, Settings):
    """What the pruned decoder's sweep reads (decode.bon_prune's schedule, the sweep's grid, the audit's budget)."""

    checkpoints: list[float] = setting(help="The schedule's checkpoints.", exclusive_minimum=0,
                                       key="decode.bon_prune.checkpoints")
    keep: list[float] = setting(help="The schedule's survivors.", exclusive_minimum=0, key="decode.bon_prune.keep")
    n: int = setting(help="Best-of-N candidates.", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response.", minimum=1, key="generation.max_new_tokens")
    tau: float = setting(help="The cost budget of the verdicts.", key="calibration.tau")
    lambda_grid: list[float] = setting(help="Lambda values of the sweep (the record adds its own).", minimum=0,
                                       key="decode.lambda_grid")
    bootstrap: int = setting(2000, "Bootstrap replicates over test prompts.", minimum=1, key="evaluation.bootstrap")
    seed: int = seed_setting()
    ties: Literal["index", "keep"] = setting("index", "A tie at a keep cut.", key="decode.bon_prune.ties")


def add_arguments(parser) -> None:
    parser.add_argument("--candidates", required=True, help="the test prompts' candidates with prefix scores")
    parser.add_argument("--lambda-json", required=True, help="the pruned decoder's own record (lambda_bon_prune.json)")
    add_settings_arguments(parser, PruneSweepSettings)
    parser.add_argument("--out", required=True, help="output CSV")


def sweep(ps, schedule, lams, labels, tau: float, n_boot: int, seed: int) -> pd.DataFrame:
    """One row per lambda: the pruned decoder's mean reward and cost on the prompts with bootstrap intervals, the
    verdict against tau, and its tokens per prompt against full Best-of-N's on the same candidates."""
    from lara.calibrate.pruned import run as run_pruned
    from lara.decode.sweep import held_out_table

    at = np.arange(ps.shape[0])
    runs = [run_pruned(ps.reward, ps.cost, ps.length, ps.prefix_reward, ps.prefix_cost, float(lam), schedule)
            for lam in lams]
    pick = np.stack([o.pick for o in runs], axis=1)  # (P, L)
    table = held_out_table(pd.DataFrame({"n": schedule.n, "lambda": np.asarray(lams, dtype=float), "label": labels}),
                           {"mean_reward": ps.reward[at[:, None], pick], "mean_cost": ps.cost[at[:, None], pick]},
                           tau, n_boot, seed)
    spent = np.stack([o.tokens for o in runs], axis=1)
    full = ps.length.sum(axis=1)
    table["tokens"] = spent.mean(axis=0)
    table["tokens_full"] = float(full.mean())
    table["token_ratio"] = full.sum() / np.maximum(1, spent.sum(axis=0))
    # keep cuts between candidates whose prefixes score and cost the same
    table["tied_cut_share"] = [o.tied_cuts.mean() / len(schedule.checkpoints) for o in runs]
    return table


def run(args) -> None:
    from lara import identity
    from lara.calibrate.procedures import check_record
    from lara.calibrate.pruned import PrunedBestOfN
    from lara.calibrate.record import read_lambda
    from lara.decode.prune import read_candidates
    from lara.decode.sweep import check_held_out, finite_grid, sweep_lambdas
    from lara.read.files import write_table
    from lara.stats import check_replicates

    s = read_settings(args, PruneSweepSettings)
    check_replicates(s.bootstrap)
    schedule = s.schedule()
    rec = read_lambda(args.lambda_json)
    check_record(rec, PrunedBestOfN(None, schedule), s.tau, f"--lambda-json {args.lambda_json}")  # its tau too
    _, ps, _, df = read_candidates(args.candidates, schedule, s.max_new_tokens)
    prompts = identity.prompt_set(df, f"--candidates {args.candidates}")
    check_held_out([rec], prompts, args.candidates)
    lams, labels = sweep_lambdas(finite_grid(s.lambda_grid), rec, feasible_only=True)
    table = sweep(ps, schedule, lams, labels, s.tau, s.bootstrap, s.seed)
    table = table.assign(record=identity.file_digest(args.lambda_json), n_prompts=prompts.n,
                         prompt_set=prompts.digest)
    for r in table.to_dict("records"):
        log.info("lambda=%.4g (%s): reward %.4f, cost %.4f [%.4f, %.4f] %s; %.1f tokens (full %.1f, ratio %.2f); "
                 "tied cuts %.2f", r["lambda"], r["label"], r["mean_reward"], r["mean_cost"], r["mean_cost_lo"],
                 r["mean_cost_hi"], r["verdict"], r["tokens"], r["tokens_full"], r["token_ratio"], r["tied_cut_share"])
    write_table(table, args.out)
