"""The toy DAG's training and calibration outputs (one shared finished run)."""

import json
import os

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.dual import PromptScores, mean_cost
from lara.scoring import load_scorer
from lara.toy.world import oracle_scores
from lara.train.common import split_eval
from lara.train.preference import oriented_pairs

pytestmark = pytest.mark.workflow


def metrics(run, model):
    return json.loads((run / "results" / "tiny" / "models" / model / "metrics.json").read_text())


def test_sft_validation_loss_falls(toy_run):
    m = metrics(toy_run, "sft")
    assert m["eval_loss_final"] < 0.5 * m["eval_loss_initial"]


def held_out_pairs(run, kind):
    """The held-out pairs of a preference model, as its trainer split them (pure numpy, seeded)."""
    settings = json.loads((run / "results/tiny/models" / kind / "training_settings.json").read_text())
    pairs = oriented_pairs(pd.read_parquet(run / "results/tiny/data/preferences.parquet"), kind)
    return split_eval(pairs, settings["eval_fraction"], settings["seed"])[1]


def test_reward_and_cost_models_learn_the_preferences(toy_run):
    reward = metrics(toy_run, "reward")["held_out"]
    cost = metrics(toy_run, "cost")["held_out"]
    # The toy world labels a pair whose helpfulness ties by a coin flip (16% of the held-out pairs),
    # so the overall accuracy carries a per-machine coin-flip term (about +-0.014) and can land on
    # either side of any fixed bar near 0.92. On the pairs the oracle decides the reward model must
    # be right (1.0 on both CPU kernel paths measured; the bar leaves 8 of ~170 pairs).
    pairs = held_out_pairs(toy_run, "reward")
    scorer = load_scorer(str(toy_run / "results/tiny/models/reward"), "reward", batch_size=64)
    hi, lo = (scorer.score(list(pairs["prompt"]), list(pairs[side])) for side in ("chosen", "rejected"))
    helpfulness = {side: oracle_scores(pairs["prompt"], pairs[side])[0] for side in ("chosen", "rejected")}
    decisive = helpfulness["chosen"] != helpfulness["rejected"]
    assert len(pairs) == reward["n_pairs"] and decisive.sum() >= 100
    assert np.mean((hi > lo)[decisive]) >= 0.95
    # metrics.json reports the same model (one near-tie may flip between the trainer's and the scorer's batching)
    assert abs(np.mean(hi > lo) - reward["pairwise_accuracy"]) <= 1 / len(pairs) + 1e-12
    # safety labels are deterministic (no ties): 1.0 and >= 0.9975 on both CPU kernel paths measured
    assert cost["sign_accuracy"] >= 0.9
    assert cost["pairwise_accuracy_safety_differs"] >= 0.9 and cost["n_pairs_safety_differs"] >= 30


def test_partial_models_improve_with_prefix_length(toy_run):
    for kind in ("reward", "cost"):
        by_len = metrics(toy_run, f"partial_{kind}")["held_out"]["accuracy_by_prefix_fraction"]
        acc = [by_len[k] for k in sorted(by_len)]
        assert acc[-1] > acc[0] + 0.05, (kind, by_len)


def test_value_functions_predict_realised_scores(toy_run):
    for kind in ("reward", "cost"):
        held = metrics(toy_run, f"value_{kind}")["held_out"]
        assert held["corr_last"] > 0.8, (kind, held)
    assert metrics(toy_run, "value_reward")["held_out"]["corr_middle"] > 0.5
    # the cost value where the cost matters: half-way through responses to harmful *test* prompts (never
    # trained on), against the cost model's score of the finished response (0.62 on one run; 0.56 when the
    # value models trained on instruction prompts only; benchmarks/value_fit.py prints the table)
    from scipy.stats import pearsonr

    from lara.scoring import ValueScorer

    res = toy_run / "results" / "tiny"
    harmful = {row["prompt"] for row in map(json.loads, (res / "toy" / "prompts.jsonl").read_text().splitlines())
               if row["category"] == "harmful"}
    df = pd.read_parquet(res / "bon" / "samples.parquet").merge(
        pd.read_parquet(res / "bon" / "scores.parquet")[["prompt_id", "sample_id", "cost"]], on=["prompt_id",
                                                                                                "sample_id"])
    df = df[df["prompt"].isin(harmful)]
    assert df["prompt_id"].nunique() > 50
    assert not set(df["prompt"]) & set(pd.read_parquet(res / "data" / "prompts_value.parquet")["prompt"])
    mid = ValueScorer(res / "models" / "value_cost", batch_size=64).prefix_values(df["prompt"].tolist(),
                                                                                 df["response"].tolist(), 0.5)
    assert pearsonr(mid, df["cost"])[0] > 0.4


def test_models_carry_settings_and_provenance(toy_run):
    models = toy_run / "results" / "tiny" / "models"
    for name in ("sft", "reward", "cost", "partial_reward", "partial_cost", "value_reward", "value_cost"):
        settings = json.loads((models / name / "training_settings.json").read_text())
        prov = json.loads((models / name / "provenance.json").read_text())
        assert settings["seed"] == 0 and prov["code"]["source_sha256"]
        assert all(len(v["sha256"]) == 64 for v in prov["inputs"].values())
    assert json.loads((models / "partial_cost" / "lara_scorer.json").read_text())["append_eos"] is False
    assert (toy_run / "results" / "tiny" / "checkpoints" / "sft").is_dir()
    # weights are as readable as every other output (safetensors writes 0600 files of its own)
    umask = os.umask(0)
    os.umask(umask)
    for f in models.rglob("*"):
        if f.is_file():
            assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f"{f}: mode {f.stat().st_mode & 0o777:o}"
    log = (toy_run / "logs" / "tiny" / "train_sft.log").read_text()
    assert "no checkpoint" in log and "step 100/" in log and "validation loss after training" in log


def test_calibration_samples_scores_and_lambda(toy_run):
    cal = toy_run / "results" / "tiny" / "calibration"
    samples = pd.read_parquet(cal / "samples.parquet")
    assert list(samples.columns) == ["prompt_id", "sample_id", "prompt", "response", "n_tokens"]
    assert len(samples) == 200 * 20 and samples.groupby("prompt_id").size().eq(20).all()
    scores = pd.read_parquet(cal / "scores.parquet")
    assert np.isfinite(scores[["reward", "cost"]].to_numpy()).all()
    # the learned scorers agree with the toy world's judge on the policy's own samples: the reward
    # correlates with the oracle's helpfulness (0.64 on both CPU kernel paths measured), and the cost
    # ranks the oracle's unsafe samples above its safe ones (AUC 0.87-0.88 measured; its Pearson
    # correlation with the oracle's harm score sat at 0.51-0.52, a coin flip against a bar of 0.5)
    h, c = oracle_scores(scores["prompt"], scores["response"])
    assert np.corrcoef(scores["reward"], h)[0, 1] > 0.5
    unsafe = c > 0
    assert 50 <= unsafe.sum() <= len(c) - 50
    ranks = scores["cost"].rank().to_numpy()
    auc = (ranks[unsafe].sum() - unsafe.sum() * (unsafe.sum() + 1) / 2) / (unsafe.sum() * (~unsafe).sum())
    assert auc > 0.75, auc
    lam = json.loads((cal / "lambda.json").read_text())
    assert lam["feasible"] and lam["n_prompts"] == 200 and lam["tau"] == -0.5 and lam["lambda_search_max"] == 5.0
    # lambda-hat solves the dual on the run's own scores, to the bisection tolerance: E_lam[c] is
    # decreasing in lambda and crosses tau inside [lambda-hat - tol, lambda-hat + tol] (or the constraint
    # is inactive and lambda-hat = 0: whether SFT's tilted cost exceeds tau on the full sample is itself
    # a ~2-sigma outcome of training, 2% of the bootstrap replicates were inactive on one kernel path)
    s = PromptScores.from_long(scores["prompt_id"].to_numpy(), scores["reward"].to_numpy(), scores["cost"].to_numpy())
    cost_at = lambda x: mean_cost(s, [x], lam["beta"], lam["mode"])[0]  # noqa: E731
    tau, tol, lam_hat = lam["tau"], lam["tolerance"], lam["lambda_hat"]
    assert lam["status"] in ("interior", "inactive")
    if lam["status"] == "interior":
        assert cost_at(max(lam_hat - tol, 0.0)) > tau >= cost_at(lam_hat + tol)
    else:
        assert lam_hat == 0.0 and cost_at(0.0) <= tau
    # lambda* is the bootstrap's upper quantile: positive (the constraint binds in far more than 2.5%
    # of the resamples), at or above the full-sample root, within lambda_search_max
    boot = lam["bootstrap"]
    assert lam["lambda_star"] == boot["quantiles"][str(boot["quantile"])]
    assert 0 <= lam_hat <= lam["lambda_star"] <= lam["lambda_search_max"] and lam["lambda_star"] > 0


def test_the_run_certifies_lambda_audits_it_and_measures_coverage(toy_run):
    """The toy config sets calibration.cost_bounds: lambda.json records CRC and LTT beside the deployed bootstrap
    lambda*, Best-of-N is decoded and audited at both, Fig. 1 marks them, and the coverage study ran on the scored
    calibration and test pools (456 prompts) with each procedure's promise visible in its table."""
    res = toy_run / "results" / "tiny"
    lam = json.loads((res / "calibration" / "lambda.json").read_text())
    procs = lam["procedures"]
    assert set(procs) == {"bootstrap", "crc", "ltt", "ltt_wsr"} and lam["guarantee"]["procedure"] == "bootstrap"
    assert lam["lambda_star"] == procs["bootstrap"]["lambda"]
    assert lam["guarantee"]["cost_bounds"] == [-8.0, 8.0] and lam["guarantee"]["clipped_fraction"] is not None
    assert procs["ltt"]["feasible"] and procs["ltt"]["p_value"] <= 0.1
    assert procs["ltt"]["lambda"] >= procs["crc"]["lambda"] >= lam["lambda_hat"]  # confidence costs lambda
    assert "with probability >= 0.9 over the draw of the 200 calibration prompts, Best-of-20" in \
        procs["ltt"]["statement"]
    audit = json.loads((res / "eval" / "constraint_audit.json").read_text())
    rows = {r["procedure"]: r for r in audit["procedures"]}
    assert rows["bootstrap"]["deployed"] and rows["bootstrap"]["setting"] == "star"
    for name in ("crc", "ltt"):
        held = rows[name]["held_out"]
        assert rows[name]["setting"] == name and held["lambda"] == pytest.approx(procs[name]["lambda"])
        assert held["verdict"].split(" ")[0] in ("met", "violated", "inconclusive")
    sweep = pd.read_csv(res / "decode" / "bon" / "sweep.csv")
    assert {"crc", "ltt"} <= set(sweep.loc[sweep["n"] == 20, "label"])
    cov = json.loads((res / "calibration" / "coverage.json").read_text())
    assert cov["population"]["n_prompts"] == 200 + 256 and cov["population"]["samples_per_prompt"] == 20
    table = pd.read_csv(res / "calibration" / "coverage.csv")
    assert set(table["procedure"]) == {"bootstrap", "crc", "ltt", "ltt_wsr"} and (table["repeats"] == 200).all()
    ltt = table[table["procedure"] == "ltt"]
    assert (ltt["violation_lo"] <= 0.1).all()  # within delta, up to the study's binomial interval
    assert (table.groupby("procedure")["reward_given_up"].min() > -1.0).all()
    assert (res / "figures" / "coverage.png").stat().st_size > 10_000
