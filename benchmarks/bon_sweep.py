"""Benchmark: Best-of-N lambda sweeps over stored candidate scores (no generation), each against the
plain numpy loop over lambda that computes the same numbers without lara's tie rule.

  argmax sweep   lara.decode.bon.sweep (Best-of-all: argmax r - lambda c, ties to the lower cost;
                 a long grid follows each prompt's winner from crossing to crossing)
                 vs  for lam: argmax(r - lam c) per prompt, then the mean reward, cost, safe share
  N < M          lara.calibrate.bestofn.expected (the exact Best-of-N rank average that
                 ``lara bon-sweep`` reports, here for the cost alone)
                 vs  for lam: argsort(r - lam c) per prompt, rank probabilities . sorted costs

Every time is the best of --repeats runs; the ratios are measured in the same run.

    python benchmarks/bon_sweep.py                  # 256 prompts x 20 candidates
    python benchmarks/bon_sweep.py --prompts 2000
"""

from __future__ import annotations

import argparse
import time

import numpy as np

PIPELINE_GRID = 9  # decode.lambda_grid in the shipped configs has 9 values (plus lambda-hat and lambda*)


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def measure(reward: np.ndarray, cost: np.ndarray, lams: np.ndarray, n: int, repeats: int, rank_average: bool):
    """[(sweep, lara seconds, plain seconds)] on one grid, after asserting both give the same numbers."""
    from lara.calibrate.bestofn import expected, rank_probabilities
    from lara.decode.bon import select, sweep

    rows = np.arange(reward.shape[0])
    mask = np.ones_like(reward, dtype=bool)
    probs = rank_probabilities(reward.shape[1], n)

    def plain_argmax():
        out = []
        for lam in lams:
            pick = np.argmax(reward - lam * cost, axis=1)
            r, c = reward[rows, pick], cost[rows, pick]
            out.append((r.mean(), c.mean(), (c <= 0).mean()))
        return np.array(out)

    def plain_rank_average():
        return np.stack([(probs * np.take_along_axis(cost, np.argsort(lam * cost - reward, axis=1), axis=1)
                          ).sum(axis=1) for lam in lams], axis=1)

    # the same numbers first (continuous scores: no ties, so the plain loops are exact here)
    table = sweep(reward, cost, lams)
    assert np.array_equal(plain_argmax(), table[["mean_reward", "mean_cost", "safe_fraction"]].to_numpy())
    picks = np.stack([np.argmax(reward - lam * cost, axis=1) for lam in lams])
    assert np.array_equal(select(reward, cost, lams), picks)
    out = [("argmax", best_time(lambda: sweep(reward, cost, lams), repeats), best_time(plain_argmax, repeats))]
    if rank_average:
        np.testing.assert_allclose(expected(reward, cost, mask, lams, n, cost)[0], plain_rank_average(), rtol=0,
                                   atol=1e-12)
        out.append((f"N = {n} < M", best_time(lambda: expected(reward, cost, mask, lams, n, cost), repeats),
                    best_time(plain_rank_average, repeats)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--candidates", type=int, default=20)
    p.add_argument("--n", type=int, default=4, help="Best-of-N size for the N < M sweep")
    p.add_argument("--grids", type=int, nargs="+", default=[PIPELINE_GRID, 100, 1000])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    reward = rng.normal(size=(args.prompts, args.candidates))
    cost = 0.5 * reward + rng.normal(size=(args.prompts, args.candidates))
    print(f"{args.prompts} prompts x {args.candidates} candidates, best of {args.repeats} runs each")
    print(f"{'sweep':<14} {'lambdas':>7} {'lara ms':>9} {'plain ms':>9} {'lara/plain':>10}")
    for n_lam in args.grids:
        # the rank average sorts every lambda either way: grids past 100 add nothing to that comparison
        for name, ours, plain in measure(reward, cost, np.linspace(0, 5, n_lam), args.n, args.repeats, n_lam <= 100):
            print(f"{name:<14} {n_lam:>7} {ours * 1e3:>9.2f} {plain * 1e3:>9.2f} {ours / plain:>9.2f}x")
    print("identical results: True (asserted for every grid)")


if __name__ == "__main__":
    main()
