"""The baselines on the finished toy run: Safe-RLHF, held to LARA's tau, has a multiplier that follows its
episode cost; both baselines move off SFT (Safe-RLHF more helpful within the budget, SafeDPO safer), and every
policy's test-prompt responses come out in the decoders' schema."""

import json

import numpy as np
import pandas as pd
import pytest

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


def test_the_baselines_move_off_sft_within_the_budget_lara_is_held_to(toy_run):
    """Safe-RLHF at LARA's tau (-0.5, far above SFT's cost, about -3 in the cost model's units) spends the slack
    on helpfulness: more helpful than SFT under the toy world's oracle, and within tau on the prompts it trains
    on (its last episodes), which is what PPO-Lagrangian's multiplier enforces; on the held-out test prompts the
    audit states its own verdict from its mean cost (in this toy world it exceeds tau there: a training-prompt
    budget does not carry over to other prompts, the point of docs/deployment.md). SafeDPO is safer than SFT.
    Both baselines leave SFT, in different directions."""
    summary = pd.read_csv(toy_run / "results/tiny/eval/summary.csv").set_index("method")
    audit = json.loads((toy_run / "results/tiny/eval/constraint_audit.json").read_text())
    policies = {r["method"]: r for r in audit["decoders"] if r["setting"] == "policy"}
    sft, rlhf, dpo = (summary.loc[m] for m in ("sft", "safe_rlhf", "safedpo"))
    assert rlhf["helpfulness_lo"] > sft["helpfulness_hi"]  # 95 % intervals apart
    assert policies["safe_rlhf"]["tau"] == audit["tau"]
    held_out = policies["safe_rlhf"]
    if held_out["mean_cost"] > audit["tau"]:
        assert not held_out["verdict"].startswith("met")
    assert dpo["harmfulness_hi"] < sft["harmfulness_lo"]
    history = json.loads((toy_run / "results/tiny/models/safe_rlhf/history.json").read_text())["history"]
    assert history[-1]["reward"] > history[0]["reward"] + 1.0  # PPO raised the reward it optimises
    assert np.mean([h["episode_cost"] for h in history[-10:]]) <= audit["tau"]  # within budget where it trains
