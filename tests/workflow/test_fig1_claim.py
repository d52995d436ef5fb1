"""The paper's RQ1 / Fig. 1 on the toy world: Best-of-N with the lambda* calibrated for it sits at
the constraint boundary on the held-out test prompts. At lambda = 0 Best-of-N violates tau (its
95 % interval lies above tau), at lambda* it meets tau, and the over-penalised setting also meets
it but gives up reward. Verdicts use the cost model that guided decoding (tau is in its units)."""

import json

import pandas as pd
import pytest

pytestmark = pytest.mark.workflow


def test_best_of_n_at_lambda_star_sits_at_the_constraint_boundary(toy_run):
    res = toy_run / "results/tiny"
    lam = json.loads((res / "calibration/lambda.json").read_text())
    assert lam["mode"] == "bon" and lam["decoder"]["n"] == 20
    tau = lam["tau"]
    sweep = pd.read_csv(res / "decode/bon/sweep.csv")
    main = sweep[sweep["n"] == lam["decoder"]["n"]]
    zero = main[(main["label"] == "grid") & (main["lambda"] == 0.0)].iloc[0]
    star = main[main["label"] == "lambda_star"].iloc[0]
    assert zero["mean_cost_lo"] > tau, zero.to_dict()  # lambda = 0 violates tau, with 95 % confidence
    assert star["mean_cost"] <= tau, star.to_dict()  # lambda* meets it
    # the over-penalised setting meets tau too, at a lower reward than lambda*
    audit = json.loads((res / "eval/constraint_audit.json").read_text())
    chosen = {s: pd.read_parquet(res / f"decode/bon/{s}/responses.parquet") for s in ("star", "max")}
    assert chosen["max"]["cost"].mean() <= tau
    assert chosen["max"]["reward"].mean() < chosen["star"]["reward"].mean()
    assert audit["mean_cost"] <= tau and audit["verdict"] != "violated"
