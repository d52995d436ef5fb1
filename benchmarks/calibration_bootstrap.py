"""Benchmark: LARA bootstrap of lambda (N prompts x K samples, NB replicates) against a naive
reference in the same process.

* soft mode: an exact root per replicate with scipy's brentq on g'_b;
* bon mode (Best-of-n for each --bon-n): per replicate, bisection over the sorted crossings of all
  prompts (found once; a replicate's mean can only change there) with the replicate's expected
  Best-of-n cost evaluated directly at each probe (sorting every prompt's samples); plus the wall
  time of the whole `lara calibrate --mode bon` command
  (process start, reading the scores, solve, bootstrap, writing lambda.json; goal <= 2 s).

    python benchmarks/calibration_bootstrap.py            # N=2000, K=20, NB=10000 (the paper's size)
    python benchmarks/calibration_bootstrap.py --naive-replicates 1000   # extrapolate the naive time

Prints the times, their ratios and the largest |lambda difference| over the replicates both ran.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def synthetic_scores(n: int, k: int, seed: int):
    """Heterogeneous prompts: per-prompt means, correlated reward and cost, varied spreads."""
    rng = np.random.default_rng(seed)
    mu_r, mu_c = rng.normal(0, 1.5, n), rng.normal(0.5, 1.5, n)
    sd_r, sd_c = rng.uniform(0.5, 2.5, n), rng.uniform(0.5, 2.5, n)
    rho = rng.uniform(-0.2, 0.8, n)
    z1, z2 = rng.standard_normal((n, k)), rng.standard_normal((n, k))
    r = mu_r[:, None] + sd_r[:, None] * z1
    c = mu_c[:, None] + sd_c[:, None] * (rho[:, None] * z1 + np.sqrt(1 - rho[:, None] ** 2) * z2)
    return np.repeat(np.arange(n), k), r.ravel(), c.ravel()


def main() -> None:
    from scipy.optimize import brentq

    from lara.calibrate.dual import PromptScores, bootstrap, dual_grad, resample_indices, solve

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=2000)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--replicates", type=int, default=10000)
    p.add_argument("--naive-replicates", type=int, default=None,
                   help="run the naive reference on the first M replicates only and extrapolate")
    p.add_argument("--tau", type=float, default=0.0)
    p.add_argument("--beta", type=float, default=1.0)
    p.add_argument("--lambda-max", type=float, default=5.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bon-n", type=int, nargs="*", default=[4, 8, 20], help="Best-of-n sizes to time (bon mode)")
    p.add_argument("--bon-naive-replicates", type=int, default=10)
    args = p.parse_args()

    s = PromptScores.from_long(*synthetic_scores(args.prompts, args.samples, args.seed))
    tau, beta, lam_max, nb = args.tau, args.beta, args.lambda_max, args.replicates
    print(f"N={args.prompts} prompts x K={args.samples} samples, NB={nb} replicates, tau={tau}, "
          f"beta={beta}, Lambda={lam_max}; {os.cpu_count()} CPUs")
    print(f"lambda_hat = {solve(s, tau, beta, lam_max).lam:.10f}")

    bootstrap(s, tau, beta, lam_max, 50, args.seed)  # warm-up (imports, BLAS threads)
    t0 = time.perf_counter()
    fast = bootstrap(s, tau, beta, lam_max, nb, args.seed)
    t_fast = time.perf_counter() - t0
    print(f"fast bootstrap : {t_fast:8.3f} s   (q97.5 = {np.quantile(fast.lams, 0.975):.8f})")

    m = args.naive_replicates or nb

    def naive(idx):
        sub = PromptScores(s.reward[idx], s.cost[idx], s.mask[idx], s.prompt_ids[idx])
        f = lambda lam: dual_grad(sub, [lam], tau, beta)[0]  # noqa: E731
        if f(0.0) >= 0:
            return 0.0
        if f(lam_max) < 0:
            return lam_max
        return brentq(f, 0.0, lam_max, xtol=1e-12, rtol=1e-14)

    t0 = time.perf_counter()
    ref = np.array([naive(idx) for _, idx in zip(range(m), resample_indices(args.seed, s.n_prompts, nb), strict=False)])
    t_naive = (time.perf_counter() - t0) * nb / m
    note = f" (extrapolated from {m} replicates)" if m < nb else ""
    print(f"naive (brentq) : {t_naive:8.3f} s{note}")
    print(f"speed-up       : {t_naive / t_fast:8.1f}x   (goal >= 50x)")
    print(f"max |lambda diff| over {m} replicates: {np.abs(ref - fast.lams[:m]).max():.3e}   (goal <= 1e-6)")
    for n in args.bon_n:
        bench_bon(s, n, args)


def bench_bon(s, n: int, args) -> None:
    import pandas as pd

    from lara.calibrate.bestofn import expected_cost, steps
    from lara.calibrate.dual import bootstrap, resample_indices

    tau, lam_max, nb = args.tau, args.lambda_max, args.replicates
    t0 = time.perf_counter()
    fast = bootstrap(s, tau, 1.0, lam_max, nb, args.seed, mode="bon", bon_n=n)
    t_fast = time.perf_counter() - t0

    cands = np.unique(steps(s.reward, s.cost, s.mask, n, lam_max).lam)  # where any prompt's cost changes

    def naive(idx):
        r, c, m = s.reward[idx], s.cost[idx], s.mask[idx]
        mean = lambda lam: expected_cost(r, c, m, [lam], n).mean()  # noqa: E731
        if mean(0.0) <= tau:
            return 0.0
        if mean(lam_max) > tau:
            return lam_max
        lo, hi = -1, len(cands) - 1  # invariant: mean(cands[hi]) <= tau < mean(cands[lo]) (lo = -1: lam 0)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if mean(cands[mid]) <= tau else (mid, hi)
        return cands[hi]

    m = min(args.bon_naive_replicates, nb)
    t0 = time.perf_counter()
    ref = np.array([naive(idx) for _, idx in zip(range(m), resample_indices(args.seed, s.n_prompts, nb), strict=False)])
    t_naive = (time.perf_counter() - t0) * nb / m
    with tempfile.TemporaryDirectory() as tmp:
        scores = Path(tmp) / "scores.parquet"
        pd.DataFrame({"prompt_id": np.repeat(s.prompt_ids, s.counts), "reward": s.reward[s.mask],
                      "cost": s.cost[s.mask]}).to_parquet(scores)
        cmd = [sys.executable, "-m", "lara", "--log-level", "WARNING", "calibrate", "--scores", str(scores),
               "--tau", str(tau), "--lambda-search-max", str(lam_max), "--bootstrap", str(nb), "--mode", "bon",
               "--bon-n", str(n), "--allow-infeasible", "--out", str(Path(tmp) / "lambda.json")]
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True)
        t_cli = time.perf_counter() - t0
    print(f"bon N={n:<3d}: bootstrap {t_fast:6.3f} s; naive bisection over crossings {t_naive:8.1f} s "
          f"(extrapolated from {m}); speed-up {t_naive / t_fast:7.1f}x; max |lambda diff| "
          f"{np.abs(ref - fast.lams[:m]).max():.1e}; whole `lara calibrate` {t_cli:5.2f} s (goal <= 2 s)")


if __name__ == "__main__":
    main()
