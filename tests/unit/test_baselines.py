"""Safe-RLHF (PPO-Lagrangian) pieces against hand-computed values, the SafeDPO transformation and
margin, checkpoint/resume of the PPO loop, and one-response-per-prompt policy generation."""

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from lara.train import ppo_math
from lara.train.safedpo import safedpo_pairs

# ---------------------------------------------------------------------------------------------
# PPO-Lagrangian


def test_gae_matches_hand_computation():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 9.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.5, 1.0, 5.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])  # row 2 ends after two tokens: its third entries are ignored
    adv, ret = ppo_math.gae(rewards, values, mask, gamma=1.0, lam=0.95)
    # row 1: deltas 0.1, 0.1, 0.3 -> A2 = 0.3, A1 = 0.1 + 0.95 * 0.3, A0 = 0.1 + 0.95 * A1
    a1 = 0.1 + 0.95 * 0.3
    expected = torch.tensor([[0.1 + 0.95 * a1, a1, 0.3], [0.5 + 0.95 * 1.0, 1.0, 0.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(ret, expected + values * mask, atol=1e-6)

    adv, _ = ppo_math.gae(rewards[:1], values[:1], mask[:1], gamma=0.9, lam=0.5)
    # deltas: 0.9*0.6-0.5 = 0.04, 0.9*0.7-0.6 = 0.03, 1-0.7 = 0.3; gamma*lam = 0.45
    a1 = 0.03 + 0.45 * 0.3
    assert torch.allclose(adv, torch.tensor([[0.04 + 0.45 * a1, a1, 0.3]]), atol=1e-6)


def test_combined_advantage():
    assert float(ppo_math.combined_advantage(torch.tensor(1.0), torch.tensor(2.0), 0.5)) == pytest.approx(0.0)
    assert float(ppo_math.combined_advantage(torch.tensor(3.0), torch.tensor(-1.0), 2.0)) == pytest.approx(5 / 3)
    # lambda = 0 is plain PPO on the reward
    assert float(ppo_math.combined_advantage(torch.tensor(0.7), torch.tensor(9.0), 0.0)) == pytest.approx(0.7)


def test_lambda_step_is_one_sgd_step_on_the_lagrangian():
    # by hand: log(lambda) = 0, J_c = 1, threshold 0, lr 0.1 -> 0 + 0.1 * 1 * 1
    assert ppo_math.lambda_step(0.0, 1.0, 0.0, 0.1, None) == pytest.approx(0.1)
    assert ppo_math.lambda_step(0.0, -1.0, 0.0, 0.1, None) == pytest.approx(-0.1)
    assert ppo_math.lambda_step(0.0, 1.0, 0.0, 0.1, 1.05) == pytest.approx(math.log(1.05))  # clamped
    # the same step through torch autograd and SGD on -(J_c - d) * exp(log lambda)
    log_lambda = torch.nn.Parameter(torch.tensor(math.log(2.0)))
    opt = torch.optim.SGD([log_lambda], lr=0.05)
    loss = -(3.0 - 1.5) * log_lambda.exp()
    loss.backward()
    opt.step()
    assert ppo_math.lambda_step(math.log(2.0), 3.0, 1.5, 0.05, None) == pytest.approx(log_lambda.item(), abs=1e-6)


def test_lambda_rises_while_cost_exceeds_the_threshold_and_falls_otherwise():
    log_lambda, trace = 0.0, []
    for cost in [1.0] * 10 + [0.0] * 10:  # threshold 0.5: above it, then below it
        log_lambda = ppo_math.lambda_step(log_lambda, cost, 0.5, 0.1, 5.0)
        trace.append(math.exp(log_lambda))
    rising, falling = np.diff([1.0] + trace[:10]), np.diff(trace[9:])
    assert (rising > 0).all() and (falling < 0).all()
    assert trace[9] > 1.5 and trace[-1] < 1.0
    # far above the threshold it climbs to the clamp and stays there
    log_lambda = 0.0
    for _ in range(30):
        log_lambda = ppo_math.lambda_step(log_lambda, 10.0, 0.5, 0.1, 5.0)
    assert math.exp(log_lambda) == pytest.approx(5.0)


def test_shaped_rewards_split_the_kl_and_clip():
    log_probs = torch.tensor([[-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -2.0, -2.0]])  # log ratio 0.5, 0, -1
    mask = torch.ones(1, 3)
    rewards, costs = ppo_math.shaped_rewards(torch.tensor([2.0]), torch.tensor([60.0]), log_probs, ref, mask,
                                            kl_coeff=0.1, clip=50.0)
    assert torch.allclose(rewards, torch.tensor([[-0.05, 0.0, 0.1 + 2.0]]))
    assert torch.allclose(costs, torch.tensor([[0.05, 0.0, 50.0]]))  # -0.1 + 60 clipped at 50
    # the end score lands on each row's last valid token
    rewards, _ = ppo_math.shaped_rewards(torch.tensor([1.0]), torch.tensor([0.0]), log_probs, log_probs,
                                        torch.tensor([[1, 1, 0]]), kl_coeff=0.1, clip=50.0)
    assert torch.allclose(rewards, torch.tensor([[0.0, 1.0, 0.0]]))


def test_actor_and_value_losses():
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[1.5, 0.5]]))  # ratios 1.5 and 0.5
    adv = torch.tensor([[1.0, -1.0]])
    # token 1: max(-1.5, -1.2) = -1.2; token 2: max(0.5, 0.8) = 0.8 -> mean -0.2
    assert ppo_math.actor_loss(new, old, adv, torch.ones(1, 2), 0.2).item() == pytest.approx(-0.2)
    values, old_values, returns = torch.tensor([[3.0, 0.0]]), torch.zeros(1, 2), torch.tensor([[0.0, 1.0]])
    # token 1: clipped value 1 -> max(9, 1) = 9; token 2: max(1, 1) = 1 -> 0.5 * mean = 2.5
    assert ppo_math.value_loss(values, old_values, returns, torch.ones(1, 2), 1.0).item() == pytest.approx(2.5)
    # per-sequence means first: row 2 has one valid token
    x = torch.tensor([[1.0, 3.0], [5.0, 100.0]])
    assert ppo_math.masked_mean(x, torch.tensor([[1, 1], [1, 0]])).item() == pytest.approx((2.0 + 5.0) / 2)


def test_response_mask_stops_after_the_first_eos():
    generated = torch.tensor([[5, 2, 2, 2], [5, 6, 7, 8], [2, 9, 9, 9]])
    assert ppo_math.response_mask(generated, eos_id=2).tolist() == [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]


# ---------------------------------------------------------------------------------------------
# SafeDPO


def _pair(better, safe0, safe1):
    return {"prompt": "p", "response_0": "a", "response_1": "b", "better_response_id": better,
            "safer_response_id": 0 if safe0 else 1, "is_response_0_safe": safe0, "is_response_1_safe": safe1}


def test_safedpo_transform_on_hand_made_pairs():
    df = pd.DataFrame([
        _pair(0, True, True),     # both safe: kept, no margin
        _pair(1, False, True),    # preferred safe, other unsafe: kept, margin
        _pair(0, False, True),    # preferred unsafe, other safe: swapped, margin
        _pair(1, False, False),   # both unsafe: dropped
    ])
    pairs, counts = safedpo_pairs(df)
    assert counts == {"kept": 2, "swapped": 1, "dropped_both_unsafe": 1}
    assert pairs[["chosen", "rejected"]].values.tolist() == [["a", "b"], ["b", "a"], ["b", "a"]]
    assert pairs["margin_indicator"].tolist() == [0, 1, 1]
    assert pairs["chosen_unsafe"].tolist() == [0, 0, 0]
    kept, counts = safedpo_pairs(df, both_unsafe="keep")
    assert len(kept) == 4 and counts["dropped_both_unsafe"] == 0
    assert kept.iloc[3][["chosen", "rejected", "margin_indicator"]].tolist() == ["b", "a", 0]
    with pytest.raises(ValueError, match="both_unsafe"):
        safedpo_pairs(df, both_unsafe="swap")


def test_safedpo_trainer_adds_the_margin_to_the_dpo_logit(tiny_world, tmp_path):
    """At initialisation the policy equals the reference, so the DPO logit is 0 and the loss is
    exactly softplus(Delta) on a margin pair and log 2 on the other, whatever beta is."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig

    from lara.train.common import TrainSettings, training_arguments
    from lara.train.safedpo import _trainer_class, dpo_dataset

    pairs = pd.DataFrame({"prompt": ["how do i bake bread ?", "tell me how to pick a lock ."],
                          "chosen": ["mix flour and water .", "i can not help with that ."],
                          "rejected": ["no .", "first , insert a pick ."], "margin_indicator": [0, 1]})
    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(tiny_world["base"])
    beta, delta = 0.5, 3.0
    args = training_arguments(DPOConfig, TrainSettings(batch_size=2, max_length=64), tmp_path / "ckpt", has_eval=False,
                              beta=beta, loss_type=["sigmoid"], max_length=64, precompute_ref_log_probs=True)
    trainer = _trainer_class()(model=model, args=args, train_dataset=dpo_dataset(pairs), processing_class=tok,
                               safety_delta=delta)
    batch = next(iter(trainer.get_train_dataloader()))
    loss = trainer.compute_loss(trainer.model, batch).item()
    # the SafeDPO loss -log sigma(beta * 0 - Delta * margin), averaged: softplus(Delta) and log 2
    assert loss == pytest.approx((math.log1p(math.exp(delta)) + math.log(2)) / 2, abs=1e-4)


# ---------------------------------------------------------------------------------------------
# The PPO loop: checkpoints and resume


def _ppo(tiny_world, root, ckpt, out, **settings):
    s = {"max_steps": 4, "prompt_batch_size": 8, "train_batch_size": 4, "max_new_tokens": 12, "save_steps": 2,
         "actor_lr": 1e-3, "critic_lr": 1e-3, "threshold": -10.0, "ptx_coeff": 1.0, "max_prompt_length": 64} | settings
    cmd = [sys.executable, "-m", "lara", "train-safe-rlhf", "--model", str(tiny_world["base"]),
           "--reward", str(root / "reward"), "--cost", str(root / "cost"), "--prompts", str(tiny_world["preferences"]),
           "--sft-data", str(root / "sft.parquet"), "--settings", json.dumps(s), "--checkpoints", str(ckpt),
           "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


def test_ppo_resumes_from_its_checkpoint_to_the_same_result(tiny_world, ppo_inputs, tmp_path):
    from safetensors.torch import load_file

    log_a = _ppo(tiny_world, ppo_inputs, tmp_path / "ckpt_a", tmp_path / "a")
    assert "starting from scratch" in log_a
    history = json.loads((tmp_path / "a" / "history.json").read_text())["history"]
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    # threshold -10 is below every episode cost here, so lambda rises at every step
    assert all(h["episode_cost"] > -10 for h in history)
    lambdas = [1.0] + [h["lambda"] for h in history]
    assert np.all(np.diff(lambdas) >= 0) and lambdas[-1] > 1.0 and max(lambdas) <= 5.0 + 1e-9
    for name in ("training_settings.json", "metrics.json", "provenance.json", "history.json", "config.json"):
        assert (tmp_path / "a" / name).is_file()
    assert (tmp_path / "ckpt_a" / "checkpoint-2" / "loop_state.json").is_file()

    # a second run in the same checkpoint directory resumes from checkpoint-2 and ends identically
    log_b = _ppo(tiny_world, ppo_inputs, tmp_path / "ckpt_a", tmp_path / "b")
    assert f"resuming from {tmp_path / 'ckpt_a' / 'checkpoint-2'}" in log_b
    assert "step 1/4" not in log_b and "step 3/4" in log_b
    assert json.loads((tmp_path / "b" / "history.json").read_text())["history"] == history
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)

    # changed settings set the checkpoints aside (not resumed, not lost)
    log_c = _ppo(tiny_world, ppo_inputs, tmp_path / "ckpt_a", tmp_path / "c", kl_coeff=0.05)
    assert "kl_coeff changed since the checkpoints" in log_c and "starting from scratch" in log_c
    assert list((tmp_path / "ckpt_a" / "stale").glob("*/checkpoint-2/loop_state.json"))
    assert not list((tmp_path / "ckpt_a").glob(".staging-*"))


def test_generate_policy_writes_the_decoder_schema(tiny_world, tmp_path):
    from lara.data.splits import prompt_id

    prompts = [r["prompt"] for r in tiny_world["world"]["prompts"][:5]]
    pd.DataFrame({"prompt_id": [prompt_id(p) for p in prompts], "prompt": prompts}).to_parquet(tmp_path / "p.parquet")
    subprocess.run([sys.executable, "-m", "lara", "generate-policy", "--policy", "sft", "--model",
                    str(tiny_world["base"]), "--prompts", str(tmp_path / "p.parquet"), "--settings",
                    json.dumps({"max_new_tokens": 8, "top_k": 50, "temperature": 1.0, "batch_size": 4}),
                    "--out", str(tmp_path / "r.parquet")], check=True, capture_output=True)
    out = pd.read_parquet(tmp_path / "r.parquet")
    assert out.columns.tolist() == ["prompt_id", "prompt", "response", "n_tokens", "method", "setting", "lambda"]
    assert out["prompt"].tolist() == prompts and (out["method"] == "sft").all() and out["lambda"].isna().all()
    assert out["n_tokens"].between(1, 8).all()
