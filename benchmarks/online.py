"""Benchmark: `lara online` (Best-of-N with the online lambda) on a long stream, against the plain loop.

  lara        lara.deploy.online.run_online: per visit the argmax of r - lambda c (a near-tie at the top goes
              through the decoder's full order), then the clipped update; the same code `lara online` runs
  plain loop  per visit lara.calibrate.bestofn.select on the visit's candidates (the decoder's own choice,
              called once per visit as a straightforward implementation would), then the same update
  floor       one vectorised Best-of-N selection of every visit at a fixed lambda (no sequential dependence:
              the same arithmetic without the update, which no online method can beat)

Both online runs must return the same choices and lambdas (asserted). The end-to-end `lara online` command on
a stream file of the same size is timed too (reading, checking, writing included). Times are the best of
--repeats runs; the ratios are measured in the same run.

    python benchmarks/online.py                      # T = 100,000 visits, N = 20
    python benchmarks/online.py --visits 20000 --n 8
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np


def best_time(fn, repeats: int):
    out = fn()
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def plain_loop(reward, cost, lam0, tau, eta):
    from lara.calibrate.bestofn import select

    lam, lams, picks = lam0, np.empty(len(reward)), np.empty(len(reward), dtype=np.int64)
    for t in range(len(reward)):
        j = int(select(reward[t:t + 1], cost[t:t + 1], lam)[0])
        lams[t], picks[t] = lam, j
        lam = max(0.0, lam + eta * (cost[t, j] - tau))
    return lams, picks


def end_to_end(reward, cost, tau, eta) -> float:
    import pandas as pd

    from lara.cli import main

    visits, n = reward.shape
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        pd.DataFrame({"t": np.repeat(np.arange(visits), n), "prompt_id": np.repeat(np.arange(visits) % 997, n),
                      "sample_id": np.tile(np.arange(n), visits), "reward": reward.ravel(),
                      "cost": cost.ravel()}).assign(prompt_id=lambda df: "p" + df.prompt_id.astype(str)).to_parquet(
            d / "stream.parquet")
        (d / "lambda.json").write_text(json.dumps({
            "lambda_hat": 0.05, "lambda_star": 0.1, "tau": tau, "mode": "bon", "feasible": True,
            "status": "interior", "decoder": {"kind": "best_of_n", "n": n, "k": n},
            "bootstrap": {"quantile": 0.975, "quantiles": {"0.975": 0.1}}}))
        settings = json.dumps({"tau": tau, "bon_n": n, "samples_per_prompt": n, "step_size": eta})
        t0 = time.perf_counter()
        rc = main(["--log-level", "WARNING", "online", "--candidates", str(d / "stream.parquet"), "--lambda-json",
                   str(d / "lambda.json"), "--settings", settings, "--out", str(d / "o.parquet"), "--record",
                   str(d / "o.json")])
        seconds = time.perf_counter() - t0
        assert rc in (0, None), rc
        return seconds


def main() -> None:
    from lara.deploy.arms import chosen
    from lara.deploy.online import run_online

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--visits", type=int, default=100_000)
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    cost = rng.normal(-1.0, 1.5, (args.visits, args.n))
    reward = 0.7 * cost + rng.normal(0, 0.5, cost.shape)
    tau, eta = -0.5, 0.01
    t_lara, trace = best_time(lambda: run_online(reward, cost, 0.1, tau, eta), args.repeats)
    t_plain, (lams, picks) = best_time(lambda: plain_loop(reward, cost, 0.1, tau, eta), max(1, args.repeats // 3))
    np.testing.assert_array_equal(trace.choice, picks)
    np.testing.assert_allclose(trace.lam, lams, rtol=0, atol=1e-12)
    t_floor, _ = best_time(lambda: chosen(reward, cost, 0.1), args.repeats)
    t_cli = end_to_end(reward, cost, tau, eta)
    print(f"T = {args.visits:,} visits, N = {args.n}")
    print(f"  lara run_online      {t_lara:8.3f} s   ({1e6 * t_lara / args.visits:.2f} us per visit)")
    print(f"  plain select loop    {t_plain:8.3f} s   lara is {t_plain / t_lara:.1f}x faster")
    print(f"  floor (fixed lambda) {t_floor:8.3f} s   lara is {t_lara / t_floor:.1f}x the floor")
    print(f"  `lara online` end to end (read, check, run, write) {t_cli:.2f} s")


if __name__ == "__main__":
    main()
