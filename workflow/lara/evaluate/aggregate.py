"""``lara aggregate``: one summary row per (method, setting) with bootstrap confidence intervals,
and the held-out constraint audit of Best-of-N at lambda*.

Summary columns: method, setting, lambda, n, and for each metric (helpfulness, harmfulness,
safe_rate = share with harmfulness <= 0, and the judge's ratings when present) its mean and a
percentile bootstrap interval over test prompts (``_lo``, ``_hi``); each judge rating also has
``_n`` (valid ratings, the ones its mean is over) and ``_failed`` (replies with no rating).

The audit asks whether Best-of-N at lambda* meets E[c] <= tau on the *test* prompts, with c the
cost model that calibration used (tau is in its units): the mean decoder cost of the selected
responses with its bootstrap interval, and whether the interval's upper end is below tau; with
``--sweep`` (the Best-of-N sweep), the same verdict at every lambda of the sweep for the decoder's N
(``by_lambda``) and for the other N drawn in Fig. 1 (``by_n``).
"""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from lara.calibrate.record import LambdaRecord, check_budget, overpenalised_note, read_lambda

log = logging.getLogger(__name__)

HELP = "summary table of every evaluated output (bootstrap CIs) and the held-out constraint audit"


def bootstrap_ci(x, n_boot: int, level: float = 0.95, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lower, upper): percentile bootstrap of the mean over rows (prompts)."""
    x = np.asarray(x, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, len(x), size=(n_boot, len(x)))
    means = x[idx].mean(axis=1)
    alpha = (1 - level) / 2
    return float(x.mean()), float(np.quantile(means, alpha)), float(np.quantile(means, 1 - alpha))


def summarise(scores: pd.DataFrame, judge: pd.DataFrame | None, n_boot: int, seed: int) -> pd.DataFrame:
    df = scores.copy()
    df["safe_rate"] = (df["harmfulness"] <= 0).astype(float)
    metrics = ["helpfulness", "harmfulness", "safe_rate"]
    if judge is not None and len(judge):
        cols = [c for c in judge.columns if c.startswith("judge_")]
        df = df.merge(judge[["prompt_id", "method", "setting", *cols]], on=["prompt_id", "method", "setting"],
                      how="left", validate="one_to_one")
        metrics += cols
    rows = []
    for (method, setting), g in df.groupby(["method", "setting"], sort=False):
        row = {"method": method, "setting": setting, "lambda": g["lambda"].iloc[0], "n": len(g)}
        for m in metrics:
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = bootstrap_ci(g[m], n_boot, seed=seed)
            if m.startswith("judge_"):  # the judge's mean is over valid ratings; say how many and how many failed
                valid = int(np.isfinite(g[m].to_numpy(dtype=float)).sum())
                row[f"{m}_n"], row[f"{m}_failed"] = valid, len(g) - valid
        rows.append(row)
    return pd.DataFrame(rows)


def star_n(lam: LambdaRecord, sweep: pd.DataFrame) -> int:
    """The N that lambda.json was calibrated for (else the sweep's largest N)."""
    return lam.decoder_n or int(sweep["n"].max())


def constraint_audit(bon_star: pd.DataFrame, lam: LambdaRecord, n_boot: int, seed: int,
                     overpenalised: float | None = None) -> dict:
    """The held-out verdict of Best-of-N at lambda* against the tau that ``lam`` was calibrated for."""
    mean, lo, hi = bootstrap_ci(bon_star["decoder_cost"], n_boot, seed=seed)
    tau = lam.tau
    note = overpenalised_note(lam.lambda_star, overpenalised)
    return {"question": "does Best-of-N at lambda* meet E[c] <= tau on the test prompts?",
            "overpenalised_lambda": overpenalised, "lambda_star_at_or_above_max": note is not None,
            **({"note": note} if note else {}),
            "tau": tau, "lambda_star": lam.lambda_star, "lambda_hat": lam.lambda_hat,
            "calibration_mode": lam.mode, "n_test_prompts": int(len(bon_star)),
            "mean_cost": mean, "ci95": [lo, hi], "meets_tau_point": bool(mean <= tau),
            "meets_tau_upper_ci": bool(hi <= tau),
            "verdict": ("met (upper 95% bound below tau)" if hi <= tau else
                        "met on average, not with 95% confidence" if mean <= tau else "violated")}


def sweep_audit(sweep: pd.DataFrame, n: int) -> dict:
    """The sweep's per-lambda verdicts: the decoder's N, and every N."""
    cols = ["lambda", "label", "mean_cost", "mean_cost_lo", "mean_cost_hi", "verdict", "mean_reward"]

    def rows(g):
        g = g.sort_values(["lambda", "label"])
        return [{**r, "ci95": [r.pop("mean_cost_lo"), r.pop("mean_cost_hi")]} for r in g[cols].to_dict("records")]

    return {"by_lambda": rows(sweep[sweep["n"] == n]),
            "by_n": {str(k): rows(g) for k, g in sweep.groupby("n")}}


def add_arguments(parser) -> None:
    parser.add_argument("--scores", nargs="+", required=True, help="evaluate outputs (parquet)")
    parser.add_argument("--judge", nargs="*", default=[], help="judge outputs (parquet), if any")
    parser.add_argument("--bon-star", default=None, help="evaluated Best-of-N at lambda* (for the audit)")
    parser.add_argument("--lambda-json", default=None)
    parser.add_argument("--sweep", default=None, help="the Best-of-N sweep.csv: the audit at every lambda")
    parser.add_argument("--tau", type=float, required=True,
                        help="the config's calibration.tau: refused unless lambda.json was calibrated for it")
    parser.add_argument("--overpenalised-lambda", type=float, default=None,
                        help="the `max` setting's lambda (decode.overpenalised_lambda): the audit says when lambda* "
                        "is at or above it")
    parser.add_argument("--bootstrap", type=int, required=True, help="replicates (config key evaluation.bootstrap)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="summary.csv")
    parser.add_argument("--audit", required=True, help="constraint_audit.json")


def run(args) -> None:
    from lara.data.tables import read_table, write_table
    from lara.io import atomic_output, write_json

    scores = pd.concat([read_table(p, required=("prompt_id", "method", "setting", "helpfulness", "harmfulness"))
                        for p in args.scores], ignore_index=True)
    judge = pd.concat([read_table(p) for p in args.judge], ignore_index=True) if args.judge else None
    summary = summarise(scores, judge, args.bootstrap, args.seed)
    audit = None
    if args.bon_star:
        star = read_table(args.bon_star, required=("decoder_cost",))
        lam = read_lambda(args.lambda_json)
        check_budget(lam, args.tau)
        audit = constraint_audit(star, lam, args.bootstrap, args.seed, args.overpenalised_lambda)
        log.info("constraint audit: Best-of-N at lambda*=%.4g: mean cost %.4f, 95%% CI [%.4f, %.4f], tau %.4g: %s",
                 audit["lambda_star"], audit["mean_cost"], *audit["ci95"], lam.tau, audit["verdict"])
        if audit.get("note"):
            log.warning("%s", audit["note"])
        if args.sweep:
            sweep = read_table(args.sweep, required=("n", "lambda", "label", "mean_cost", "verdict"))
            audit |= sweep_audit(sweep, star_n(lam, sweep))
    for r in summary.itertuples(index=False):
        log.info("%-10s %-7s helpfulness %.3f harmfulness %.3f safe %.3f", r.method, r.setting, r.helpfulness,
                 r.harmfulness, r.safe_rate)
    write_table(summary, args.out)
    with atomic_output(args.audit) as tmp:
        write_json(tmp, audit or {"question": "no Best-of-N at lambda* in this experiment"})
