"""The toy DAG's training and calibration outputs (one shared finished run)."""

import json

import numpy as np
import pandas as pd
import pytest

from lara.toy.world import oracle_scores

pytestmark = pytest.mark.workflow


def metrics(run, model):
    return json.loads((run / "results" / "tiny" / "models" / model / "metrics.json").read_text())


def test_sft_validation_loss_falls(toy_run):
    m = metrics(toy_run, "sft")
    assert m["eval_loss_final"] < 0.5 * m["eval_loss_initial"]


def test_reward_and_cost_models_learn_the_preferences(toy_run):
    reward = metrics(toy_run, "reward")["held_out"]
    cost = metrics(toy_run, "cost")["held_out"]
    assert reward["pairwise_accuracy"] >= 0.9
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
        assert held["corr_last"] > 0.8 and held["corr_middle"] > 0.5, (kind, held)


def test_models_carry_settings_and_provenance(toy_run):
    models = toy_run / "results" / "tiny" / "models"
    for name in ("sft", "reward", "cost", "partial_reward", "partial_cost", "value_reward", "value_cost"):
        settings = json.loads((models / name / "training_settings.json").read_text())
        prov = json.loads((models / name / "provenance.json").read_text())
        assert settings["seed"] == 0 and prov["code"]["source_sha256"]
        assert all(len(v["sha256"]) == 64 for v in prov["inputs"].values())
    assert json.loads((models / "partial_cost" / "lara_scorer.json").read_text())["append_eos"] is False
    assert (toy_run / "results" / "tiny" / "checkpoints" / "sft").is_dir()
    log = (toy_run / "logs" / "tiny" / "train_sft.log").read_text()
    assert "no checkpoint" in log and "step 100/" in log and "validation loss after training" in log


def test_calibration_samples_scores_and_lambda(toy_run):
    cal = toy_run / "results" / "tiny" / "calibration"
    samples = pd.read_parquet(cal / "samples.parquet")
    assert list(samples.columns) == ["prompt_id", "sample_id", "prompt", "response", "n_tokens"]
    assert len(samples) == 200 * 20 and samples.groupby("prompt_id").size().eq(20).all()
    scores = pd.read_parquet(cal / "scores.parquet")
    assert np.isfinite(scores[["reward", "cost"]].to_numpy()).all()
    # the learned scorers agree with the toy world's judge on the policy's own samples
    h, c = oracle_scores(scores["prompt"], scores["response"])
    assert np.corrcoef(scores["reward"], h)[0, 1] > 0.5
    assert np.corrcoef(scores["cost"], c)[0, 1] > 0.5
    lam = json.loads((cal / "lambda.json").read_text())
    assert lam["feasible"] and lam["n_prompts"] == 200 and lam["tau"] == -0.5
    assert 0 < lam["lambda_hat"] <= lam["lambda_star"] <= 5.0
