"""The baselines on the finished toy run: Safe-RLHF's multiplier follows its episode cost, the
trained policy is less harmful than SFT under the toy world's oracle, and every policy's
test-prompt responses come out in the decoders' schema."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from lara.toy.world import oracle_scores

pytestmark = pytest.mark.workflow


def test_lambda_follows_the_episode_cost(toy_run):
    model = toy_run / "results/tiny/models/safe_rlhf"
    history = json.loads((model / "history.json").read_text())["history"]
    settings = json.loads((model / "training_settings.json").read_text())
    tau = json.loads((toy_run / "results/tiny/calibration/lambda.json").read_text())["tau"]
    assert len(history) == settings["max_steps"] and settings["threshold"] == tau  # LARA's budget, as in the paper
    lam = np.array([1.0] + [h["lambda"] for h in history])
    over = np.array([h["episode_cost"] > h["threshold"] for h in history])
    step = np.diff(lam)
    at_clamp = np.isclose(lam[1:], settings["lambda_clamp"]) & np.isclose(lam[:-1], settings["lambda_clamp"])
    # each dual step moves lambda up while the windowed cost exceeds the threshold, down otherwise
    assert np.all((step > 0)[over & ~at_clamp]) and np.all((step < 0)[~over])
    assert all(h["kl"] == h["kl"] for h in history)  # logged every step, never NaN


def test_policy_responses_share_the_decoder_schema(toy_run):
    prompts = pd.read_parquet(toy_run / "results/tiny/data/prompts_test.parquet")
    columns = pd.read_parquet(toy_run / "results/tiny/decode/args/zero/responses.parquet").columns
    for policy in ("sft", "safe_rlhf", "safedpo"):
        out = pd.read_parquet(toy_run / f"results/tiny/decode/{policy}/responses.parquet")
        assert set(columns) <= set(out.columns), policy
        assert out["prompt_id"].tolist() == prompts["prompt_id"].tolist()
        assert (out["method"] == policy).all() and (out["setting"] == "policy").all()
        assert (out["response"].str.len() > 0).mean() > 0.9


def _oracle_harm(toy_run, model, tmp_path):
    out = tmp_path / f"{model}.parquet"
    subprocess.run([sys.executable, "-m", "lara", "sample", "--model", str(toy_run / "results/tiny/models" / model),
                    "--prompts", str(toy_run / "results/tiny/data/prompts_test.parquet"), "--n", "8", "--seed", "3",
                    "--settings", json.dumps({"top_k": 50, "temperature": 1.2, "max_new_tokens": 48, "batch_size": 64}),
                    "--out", str(out)], check=True, capture_output=True)
    df = pd.read_parquet(out)
    _, harm = oracle_scores(df["prompt"], df["response"])
    return harm


def test_safe_rlhf_and_safedpo_are_less_harmful_than_sft(toy_run, tmp_path):
    """8 samples per test prompt (512 responses per policy) judged by the toy oracle."""
    sft = _oracle_harm(toy_run, "sft", tmp_path)
    safe_rlhf = _oracle_harm(toy_run, "safe_rlhf", tmp_path)
    safedpo = _oracle_harm(toy_run, "safedpo", tmp_path)
    assert safe_rlhf.mean() < sft.mean() and (safe_rlhf > 0).mean() < (sft > 0).mean()
    assert safedpo.mean() < sft.mean()
