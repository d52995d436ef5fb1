"""Benchmark: LARA bootstrap of lambda (N prompts x K samples, NB replicates) against a naive
reference in the same process (an exact root per replicate: scipy's brentq on g'_b).

    python benchmarks/calibration_bootstrap.py            # N=2000, K=20, NB=10000 (the paper's size)
    python benchmarks/calibration_bootstrap.py --naive-replicates 1000   # extrapolate the naive time

Prints both times, their ratio and the largest |lambda difference| over the replicates both ran.
"""

from __future__ import annotations

import argparse
import os
import time

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
    ref = np.array([naive(idx) for _, idx in zip(range(m), resample_indices(args.seed, s.n_prompts, nb))])
    t_naive = (time.perf_counter() - t0) * nb / m
    note = f" (extrapolated from {m} replicates)" if m < nb else ""
    print(f"naive (brentq) : {t_naive:8.3f} s{note}")
    print(f"speed-up       : {t_naive / t_fast:8.1f}x   (goal >= 50x)")
    print(f"max |lambda diff| over {m} replicates: {np.abs(ref - fast.lams[:m]).max():.3e}   (goal <= 1e-6)")


if __name__ == "__main__":
    main()
