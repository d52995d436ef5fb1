"""Pruned Best-of-N on the finished toy run: its own record, its outputs on the test prompts' candidates, the audit's
pruned section, Fig. 1's curve and the summary."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import yaml

from lara.calibrate import pruned

pytestmark = pytest.mark.workflow


def config(toy_run):
    return yaml.safe_load((toy_run / "config" / "config.yaml").read_text())


def test_the_record_is_the_pruned_decoders_own(toy_run):
    from lara.calibrate.record import read_lambda

    res = toy_run / "results" / "tiny"
    rec = read_lambda(res / "calibration" / "lambda_bon_prune.json")
    full = read_lambda(res / "calibration" / "lambda.json")
    cfg = config(toy_run)["decode"]
    assert rec.decoder == {"kind": "pruned_best_of_n", "n": cfg["bon_n"], "k": 20,
                           "schedule": {"n": cfg["bon_n"], "checkpoints": cfg["bon_prune"]["checkpoints"],
                                        "keep": cfg["bon_prune"]["keep"]}}
    grid = np.asarray(rec.get("curves")["lambda"])
    for name, p in rec.get("procedures").items():  # every deployed lambda is a grid point
        assert np.isclose(grid, p["lambda"]).any(), name
    assert rec.lambda_hat <= rec.lambda_star
    # its calibration-set mean cost at lambda-hat meets tau, and from there to Lambda on the grid it stays met
    cost = np.asarray(rec.get("curves")["mean_cost"])
    assert (cost[grid >= rec.lambda_hat] <= rec.tau + 1e-9).all()
    assert rec.get("tokens")["ratio_at_lambda_star"] > 2.0
    assert rec.lambda_star != full.lambda_star  # a different decoder: its own lambda


def test_the_recorded_curve_is_the_decoder_on_the_calibration_samples(toy_run):
    """The record's mean cost at lambda* recomputed from the prefix-score table, and the vectorised decoder equal
    to the plain per-subset loop on real toy prompts."""
    from lara.calibrate.record import read_lambda
    from lara.read.candidates import read_prefix_scores

    res = toy_run / "results" / "tiny"
    rec = read_lambda(res / "calibration" / "lambda_bon_prune.json")
    s = rec.decoder["schedule"]
    schedule = pruned.Schedule(s["n"], tuple(s["checkpoints"]), tuple(s["keep"]))
    table = res / "calibration" / "prefix_scores.parquet"
    _, arrays, _, _ = read_prefix_scores(table, schedule.checkpoints, "--scores")
    ps = pruned.PrefixScores(*arrays)
    cv = pruned.curves(ps, schedule, [rec.lambda_hat, rec.lambda_star])
    assert cv.cost[:, 1].mean() == pytest.approx(rec.get("decoder_cost_at_lambda_star"), abs=1e-9)
    assert cv.tokens[:, 1].mean() == pytest.approx(rec.get("tokens")["at_lambda_star"], abs=1e-9)
    few = pruned.PrefixScores(*(a[:12] for a in arrays))
    bf = pruned.brute_force(few, schedule, rec.lambda_star)
    np.testing.assert_allclose(cv.cost[:12, 1], bf["cost"], atol=1e-9)
    np.testing.assert_allclose(cv.tokens[:12, 1], bf["tokens"], atol=1e-9)


def test_pruned_outputs_choose_among_the_candidates_with_fewer_tokens(toy_run):
    res = toy_run / "results" / "tiny"
    cands = pd.read_parquet(res / "bon" / "prefix_scores.parquet")
    full = pd.read_parquet(res / "decode" / "bon" / "star" / "responses.parquet").set_index("prompt_id")
    for setting in ("zero", "star", "ltt"):
        df = pd.read_parquet(res / "decode" / "bon_prune" / setting / "responses.parquet")
        assert len(df) == 256 and df["prompt_id"].is_unique and (df["method"] == "bon_prune").all()
        mine = df.merge(cands, on=["prompt_id", "sample_id"], suffixes=("", "_c"))
        assert len(mine) == 256 and (mine["response"] == mine["response_c"]).all()
        assert (df["tokens"] <= df["tokens_full"]).all() and df["tokens"].sum() * 2 < df["tokens_full"].sum()
        want = cands.groupby("prompt_id")["n_tokens"].sum()
        assert (df.set_index("prompt_id")["tokens_full"].sort_index() == want.sort_index()).all()
    assert len(full) == 256


def test_the_audit_summary_and_fig1_hold_the_pruned_decoder(toy_run):
    from tests.conftest import lara_in_process

    res = toy_run / "results" / "tiny"
    audit = json.loads((res / "eval" / "constraint_audit.json").read_text())
    pr = audit["pruned"]
    by = {r["setting"]: r for r in pr["settings"]}
    assert {"zero", "hat", "star", "ltt", "ltt_wsr"} <= set(by)
    for r in by.values():
        assert r["token_ratio"] > 2.0
        assert {d["metric"] for d in r["paired_vs_full"]} >= {"decoder_reward", "decoder_cost"}
    held = {r["procedure"]: r["held_out"] for r in pr["procedures"]}
    assert held["ltt"]["verdict"] and held["bootstrap"]["verdict"]
    decoders = {(r["method"], r["setting"]) for r in audit["decoders"]}
    assert {("bon_prune", s) for s in ("zero", "hat", "star", "ltt")} <= decoders
    rc, out, err = lara_in_process(["summary", str(res)], cwd=toy_run)
    assert rc == 0, err
    assert "pruned Best-of-20" in out and "coverage (" in out
    prov = json.loads((res / "figures" / "lambda_sweep.provenance.json").read_text())
    assert any("bon_prune/sweep.csv" in str(i) for i in json.dumps(prov).split('"'))
    sweep = pd.read_csv(res / "decode" / "bon_prune" / "sweep.csv")
    assert {"grid", "lambda_hat", "lambda_star", "ltt"} <= set(sweep["label"])
    cov = pd.read_csv(res / "calibration" / "coverage_bon_prune.csv")
    # LTT's promise on the finite population: its violation rate's interval reaches down to delta or below
    ltt = cov[cov["procedure"] == "ltt"]
    assert (ltt["violation_lo"] <= 0.1).all()
