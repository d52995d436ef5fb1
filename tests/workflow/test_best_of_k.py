"""Best-of-k through the calibration core on the finished toy run: one record per Fig. 1 size, the same decoder as the
exact calibration of that size (its lambdas rounded up to the grid), and its lambdas audited in the sweep."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from lara.stats import VERDICTS

pytestmark = pytest.mark.workflow


def test_each_fig1_size_has_its_core_record_and_audited_rows(toy_run):
    from lara.calibrate.record import read_lambda

    res = toy_run / "results" / "tiny"
    cfg = yaml.safe_load((toy_run / "config" / "config.yaml").read_text())
    sizes = sorted({*cfg["decode"]["sweep_n"], cfg["decode"]["bon_n"]})
    sweep = pd.read_csv(res / "decode" / "bon" / "sweep.csv")
    for k in sizes:
        core = read_lambda(res / "calibration" / f"lambda_bon_k{k}.json")
        exact = read_lambda(res / "calibration" / ("lambda.json" if k == cfg["decode"]["bon_n"]
                                                   else f"lambda_bon{k}.json"))
        assert core.decoder == {"kind": "best_of_k", "n": k, "k": exact.decoder["k"], "of_n": cfg["decode"]["bon_n"]}
        assert core.tau == exact.tau
        grid = np.asarray(core.get("curves")["lambda"])
        # Best-of-k's cost is monotone: the core's searches are the exact ones rounded up to the grid
        assert core.get("monotone")
        up = grid[np.searchsorted(grid, exact.lambda_hat - 1e-7)]
        assert core.lambda_hat == pytest.approx(up, abs=1e-12)
        for name in ("crc", "ltt"):
            want = exact.get("procedures")[name]
            if want["feasible"]:
                assert core.procedure_lambda(name) == pytest.approx(
                    grid[np.searchsorted(grid, want["lambda"] - 1e-7)], abs=1e-12), (k, name)
        tokens = core.get("tokens")
        assert tokens["at_lambda_star"] == pytest.approx(tokens["full_best_of_n"] * k / cfg["decode"]["bon_n"])
        rows = sweep[(sweep["n"] == k) & sweep["label"].str.startswith("core:")]
        assert set(rows["label"]) >= {"core:hat", "core:bootstrap"}
        star = rows[rows["label"] == f"core:{core.get('guarantee')['procedure']}"]
        assert float(star["lambda"].iloc[0]) == pytest.approx(core.lambda_star)
        assert set(rows["verdict"]) <= set(VERDICTS)
