"""``lara train-safe-rlhf``: the Safe-RLHF baseline, PPO-Lagrangian, as the project's own loop.

TRL (>= 1.13) has no PPO trainer, and the old one had one reward model, one critic and no
multiplier, so this is a loop on ``accelerate`` that follows Safe-RLHF's algorithm
(Dai et al. 2024, PKU-Alignment/safe-rlhf ``ppo_lag``):

* actor pi initialised from SFT; the frozen SFT model is the reference pi_ref; the trained
  reward model r and cost model c score finished responses;
* two critics (reward critic initialised from r, cost critic from c) give a value per
  response token; each has its own GAE (gamma, lambda_gae) and a clipped value loss;
* per-token rewards: the KL penalty k_t = -kl_coeff * (log pi - log pi_ref) on every response
  token, added to the reward stream and subtracted from the cost stream (the split of
  Safe-RLHF after its PR #173: with the advantage below the policy sees the KL at weight
  (kl + lambda kl) / (1 + lambda) = kl_coeff), plus the end score at the last response token;
  both clipped at +-clip_range_score;
* the multiplier is stored as log(lambda) and moved by one SGD step before every actor update
  on the loss -(J_c - threshold) * lambda, where J_c is the mean cost-model score of the last
  ``episode_cost_window_size`` episodes (so lambda rises while J_c exceeds the threshold and
  falls otherwise), clamped at lambda_max;
* the actor maximises the PPO clipped surrogate of (A_r - lambda A_c) / (1 + lambda), plus an
  optional pre-training (ptx) loss on the SFT data, as in Safe-RLHF's scripts.

Every step logs lambda, the episode cost against the threshold, reward, cost and KL, and the
per-step history is saved with the model (``history.json``). Checkpoints (models,
optimisers, schedulers, RNG state, lambda and the episode window) are written every
``save_steps`` rollouts and a rerun with the same settings and inputs resumes from the last.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np

from lara.settings import Settings, add_settings_arguments, read_settings, setting

log = logging.getLogger(__name__)

HELP = "Safe-RLHF baseline: PPO-Lagrangian with reward and cost critics (own accelerate loop)"


@dataclass(frozen=True)
class PPOLagSettings(Settings):
    """train.safe_rlhf. Defaults follow Safe-RLHF's published ``scripts/ppo-lag.sh``. The threshold is
    its own key (not calibration.tau), so changing tau never retrains the baseline."""

    SECTION: ClassVar[str] = "train.safe_rlhf"

    epochs: float = setting(1.0, "Passes over the training prompts.", exclusive_minimum=0)
    max_steps: int = setting(-1, "Rollouts to run (-1 = by epochs).", minimum=-1)
    prompt_batch_size: int = setting(16, "Prompts per rollout per process.", minimum=1)
    train_batch_size: int = setting(16, "PPO minibatch per process.", minimum=1)
    update_iters: int = setting(1, "PPO epochs over each rollout.", minimum=1)
    actor_lr: float = setting(1e-5, "Actor learning rate.", exclusive_minimum=0)
    critic_lr: float = setting(5e-6, "Learning rate of both critics.", exclusive_minimum=0)
    actor_weight_decay: float = setting(0.01, "Actor AdamW weight decay.", minimum=0)
    critic_weight_decay: float = setting(0.0, "Critics' AdamW weight decay.", minimum=0)
    lr_scheduler: str = setting("cosine", "Actor learning-rate schedule (a transformers scheduler name).")
    critic_lr_scheduler: str = setting("constant", "Critics' learning-rate schedule.")
    warmup_ratio: float = setting(0.03, "Warm-up share of each schedule.", minimum=0, maximum=1)
    max_grad_norm: float = setting(1.0, "Gradient clipping norm.", exclusive_minimum=0)
    kl_coeff: float = setting(0.01, "Per-token KL penalty against the SFT reference.", minimum=0)
    clip_range_ratio: float = setting(0.2, "PPO ratio clip epsilon.", exclusive_minimum=0)
    clip_range_score: float = setting(50.0, "Per-token reward/cost clip.", exclusive_minimum=0)
    clip_range_value: float = setting(5.0, "Value-loss clip around the old values.", exclusive_minimum=0)
    gamma: float = setting(1.0, "GAE discount.", minimum=0, maximum=1)
    gae_lambda: float = setting(0.95, "GAE lambda.", minimum=0, maximum=1)
    threshold: float = setting(0.0, "Cost budget d of E[c] <= d, in cost-model units.")
    lambda_init: float = setting(1.0, "Initial Lagrange multiplier.", exclusive_minimum=0)
    lambda_lr: float = setting(0.1, "SGD learning rate of log(lambda).", exclusive_minimum=0)
    lambda_max: float | None = setting(5.0, "Upper clamp of lambda (null = none).", exclusive_minimum=0)
    lambda_update_delay_steps: int = setting(0, "Rollouts before lambda starts to move.", minimum=0)
    episode_cost_window_size: int = setting(128, "Episodes in the moving mean cost J_c.", minimum=1)
    ptx_coeff: float = setting(16.0, "Weight of the SFT (ptx) loss on the actor (0 = off).", minimum=0)
    temperature: float = setting(1.0, "Rollout sampling temperature.", exclusive_minimum=0)
    top_k: int = setting(50, "Rollout top-k (0 = off; 50 is what Safe-RLHF's sampling inherits).", minimum=0)
    top_p: float = setting(1.0, "Rollout nucleus mass.", exclusive_minimum=0, maximum=1)
    max_new_tokens: int = setting(128, "Longest rollout response.", minimum=1)
    max_prompt_length: int = setting(384, "Prompts are truncated to this many tokens.", minimum=1)
    save_steps: int = setting(100, "Checkpoint every this many rollouts (a rerun resumes).", minimum=1,
                              bookkeeping=True)
    logging_steps: int = setting(1, "Log every this many rollouts.", minimum=1, bookkeeping=True)
    seed: int = setting(0, "The experiment seed (config key seed).", minimum=0, config=False)
    dtype: Literal["float32", "bfloat16", "float16"] = setting(
        "float32", "Weight dtype (config key base_model.dtype).", config=False)


# ---------------------------------------------------------------------------------------------
# The algorithm's pieces, as pure torch functions (tested against hand-computed values)


def masked_mean(x, mask):
    """Mean over each row's valid tokens, then over the rows (Safe-RLHF's reduction)."""
    mask = mask.to(x.dtype)
    return ((x * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)).mean()


def gae(rewards, values, mask, gamma: float, lam: float):
    """Generalised advantage estimation over response tokens.

    ``rewards``, ``values`` and ``mask`` are [B, T]; row b's valid tokens are the first
    ``mask[b].sum()`` positions. After a row's last token the next value is 0 (the episode
    ends). Returns (advantages, returns = advantages + values), zero beyond each row's end.
    """
    import torch

    mask = mask.to(values.dtype)
    rewards, values = rewards * mask, values * mask
    advantages = torch.zeros_like(values)
    running = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        next_value = values[:, t + 1] if t + 1 < values.shape[1] else torch.zeros_like(running)
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = (delta + gamma * lam * running) * mask[:, t]
        advantages[:, t] = running
    return advantages, advantages + values


def combined_advantage(adv_reward, adv_cost, lam: float):
    """The actor's advantage (A_r - lambda A_c) / (1 + lambda)."""
    return (adv_reward - lam * adv_cost) / (1.0 + lam)


def lambda_step(log_lambda: float, episode_cost: float, threshold: float, lr: float,
                lambda_max: float | None) -> float:
    """One SGD step of log(lambda) on the loss -(J_c - threshold) * lambda, then the clamp.

    d loss / d log(lambda) = -(J_c - threshold) * lambda, so
    log(lambda) <- log(lambda) + lr * (J_c - threshold) * lambda."""
    new = log_lambda + lr * (episode_cost - threshold) * math.exp(log_lambda)
    if lambda_max is not None:
        new = min(new, math.log(lambda_max))
    return new


def shaped_rewards(end_reward, end_cost, log_probs, ref_log_probs, mask, kl_coeff: float, clip: float):
    """Per-token reward and cost streams: the KL penalty added to the reward and subtracted from
    the cost (which is minimised), the end scores at each row's last response token; clipped."""
    import torch

    mask = mask.to(log_probs.dtype)
    kl_penalty = -kl_coeff * (log_probs - ref_log_probs) * mask
    last = (mask.sum(dim=1).long() - 1).clamp(min=0)
    rows = torch.arange(mask.shape[0], device=mask.device)
    rewards, costs = kl_penalty.clone(), -kl_penalty
    rewards[rows, last] += end_reward.to(rewards.dtype)
    costs[rows, last] += end_cost.to(costs.dtype)
    return rewards.clamp(-clip, clip) * mask, costs.clamp(-clip, clip) * mask


def actor_loss(log_probs, old_log_probs, advantages, mask, clip: float):
    """PPO clipped surrogate (to be minimised), averaged over response tokens."""
    import torch

    ratio = torch.exp(log_probs - old_log_probs)
    surrogate = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip, 1.0 + clip))
    return masked_mean(surrogate, mask)


def value_loss(values, old_values, returns, mask, clip: float):
    """Clipped value loss 0.5 * max((v - R)^2, (v_clipped - R)^2), averaged over tokens."""
    import torch

    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return 0.5 * masked_mean(torch.maximum((values - returns) ** 2, (clipped - returns) ** 2), mask)


def response_mask(generated, eos_id: int):
    """1 for generated tokens up to and including the first EOS, 0 after it."""
    import torch

    is_eos = (generated == eos_id).long()
    before = torch.cumsum(is_eos, dim=1) - is_eos  # EOS tokens strictly before this one
    return (before == 0).long()


# ---------------------------------------------------------------------------------------------
# Models


def _token_critic_class():
    import torch

    class TokenCritic(torch.nn.Module):
        """A ``*ForSequenceClassification`` model read at every position: one value per token."""

        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask, position_ids):
            backbone = getattr(self.model, self.model.base_model_prefix)
            hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              use_cache=False).last_hidden_state
            return self.model.score(hidden).squeeze(-1).float()

    return TokenCritic


def token_log_probs(model, input_ids, attention_mask, position_ids):
    """log pi(x_{t+1} | x_{<=t}) for t = 0 .. L-2, in float32."""
    from trl.trainer.utils import selective_log_softmax

    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   use_cache=False).logits[:, :-1].float()
    return selective_log_softmax(logits, input_ids[:, 1:])


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class LoopState:
    step: int
    log_lambda: float
    window: list[float]
    history: list[dict]


def _save_checkpoint(accelerator, checkpoint_dir: Path, state: LoopState, keep: int = 2) -> None:
    path = checkpoint_dir / f"checkpoint-{state.step}"
    accelerator.save_state(str(path))
    if accelerator.is_main_process:
        (path / "loop_state.json").write_text(json.dumps(asdict(state)))
        done = sorted(checkpoint_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
        for old in done[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()
    log.info("checkpoint saved at step %d", state.step)


def _last_checkpoint(checkpoint_dir: Path) -> Path | None:
    done = [p for p in checkpoint_dir.glob("checkpoint-*") if (p / "loop_state.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("-")[1])) if done else None


def train_safe_rlhf(sft_path: str, reward_path: str, cost_path: str, prompts_path: str, sft_data_path: str | None,
                    checkpoints: str, out: str, s: PPOLagSettings) -> dict:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, get_scheduler
    from trl.models.utils import unwrap_model_for_generation
    from trl.trainer.utils import disable_dropout_in_model

    from lara.data.tables import read_table
    from lara.scoring import SequenceScorer, encode, pad_batch, position_ids
    from lara.template import format_prompt
    from lara.train.common import discard_stale_checkpoints, fingerprint, save_model, torch_dtype

    cuda = torch.cuda.is_available()
    mixed = {"bfloat16": "bf16", "float16": "fp16"}.get(s.dtype, "no") if cuda else "no"
    accelerator = Accelerator(cpu=not cuda, mixed_precision=mixed)
    set_seed(s.seed)
    dev = accelerator.device
    frozen_dtype = torch_dtype(s.dtype) if cuda else torch.float32

    prompts_df = read_table(prompts_path, required=("prompt",))
    prompts = list(dict.fromkeys(str(p) for p in prompts_df["prompt"]))  # distinct, in order
    tok = AutoTokenizer.from_pretrained(sft_path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"

    actor = AutoModelForCausalLM.from_pretrained(sft_path, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(sft_path, dtype=frozen_dtype).to(dev).eval().requires_grad_(False)
    TokenCritic = _token_critic_class()
    reward_critic = TokenCritic(AutoModelForSequenceClassification.from_pretrained(reward_path, dtype=torch.float32))
    cost_critic = TokenCritic(AutoModelForSequenceClassification.from_pretrained(cost_path, dtype=torch.float32))
    for m in (actor, reward_critic, cost_critic):
        disable_dropout_in_model(m)
    reward_model = SequenceScorer(reward_path, device=str(dev), dtype=s.dtype if cuda else "float32")
    cost_model = SequenceScorer(cost_path, device=str(dev), dtype=s.dtype if cuda else "float32")

    world = accelerator.num_processes
    steps_per_epoch = max(1, len(prompts) // (s.prompt_batch_size * world))
    total = s.max_steps if s.max_steps > 0 else max(1, math.ceil(s.epochs * steps_per_epoch))
    updates_per_step = s.update_iters * math.ceil(s.prompt_batch_size / s.train_batch_size)

    def optimiser(model, lr, wd, schedule):
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
        sched = get_scheduler(schedule, opt, num_warmup_steps=int(s.warmup_ratio * total * updates_per_step),
                              num_training_steps=total * updates_per_step)
        return opt, sched

    actor_opt, actor_sched = optimiser(actor, s.actor_lr, s.actor_weight_decay, s.lr_scheduler)
    rc_opt, rc_sched = optimiser(reward_critic, s.critic_lr, s.critic_weight_decay, s.critic_lr_scheduler)
    cc_opt, cc_sched = optimiser(cost_critic, s.critic_lr, s.critic_weight_decay, s.critic_lr_scheduler)
    (actor, actor_opt, actor_sched, reward_critic, rc_opt, rc_sched, cost_critic, cc_opt,
     cc_sched) = accelerator.prepare(actor, actor_opt, actor_sched, reward_critic, rc_opt, rc_sched,
                                     cost_critic, cc_opt, cc_sched)

    ptx = None
    if s.ptx_coeff > 0 and sft_data_path:
        sft_df = read_table(sft_data_path, required=("prompt", "output"))
        ptx = [(len(tok(format_prompt(p))["input_ids"]), encode(tok, p, o, True, s.max_prompt_length + s.max_new_tokens))
               for p, o in zip(sft_df["prompt"], sft_df["output"], strict=True)]

    inputs = {"sft": sft_path, "reward": reward_path, "cost": cost_path, "prompts": prompts_path}
    if ptx is not None:
        inputs["sft_data"] = sft_data_path
    checkpoint_dir = Path(checkpoints)
    if accelerator.is_main_process:
        discard_stale_checkpoints(checkpoint_dir, fingerprint(s, inputs))
    accelerator.wait_for_everyone()
    state = LoopState(step=0, log_lambda=math.log(s.lambda_init), window=[], history=[])
    resume = _last_checkpoint(checkpoint_dir)
    if resume is not None:
        accelerator.load_state(str(resume))
        state = LoopState(**json.loads((resume / "loop_state.json").read_text()))
        log.info("resuming from %s", resume)
    else:
        log.info("no checkpoint in %s: starting from scratch", checkpoint_dir)
    window = deque(state.window, maxlen=s.episode_cost_window_size)
    log.info("PPO-Lagrangian: %d prompts, %d rollouts of %d prompts x %d processes, threshold %.4g, lambda_0 %.4g",
             len(prompts), total, s.prompt_batch_size, world, s.threshold, math.exp(state.log_lambda))

    def batch_prompts(step: int) -> list[str]:
        epoch, within = divmod(step, steps_per_epoch)
        order = np.random.default_rng([s.seed, epoch]).permutation(len(prompts))
        lo = (within * world + accelerator.process_index) * s.prompt_batch_size
        return [prompts[i] for i in order[lo:lo + s.prompt_batch_size]]

    pad_id = tok.pad_token_id
    while state.step < total:
        step = state.step
        # ---- rollout ------------------------------------------------------------------------
        texts = batch_prompts(step)
        enc = tok([format_prompt(p) for p in texts], return_tensors="pt", padding=True, truncation=True,
                  max_length=s.max_prompt_length, add_special_tokens=True).to(dev)
        gen_kwargs = dict(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                          max_new_tokens=s.max_new_tokens, pad_token_id=pad_id, eos_token_id=tok.eos_token_id)
        torch.manual_seed(s.seed * 1_000_003 + step * world + accelerator.process_index)
        with torch.no_grad(), unwrap_model_for_generation(actor, accelerator) as unwrapped:
            unwrapped.eval()
            seq = unwrapped.generate(**enc, **gen_kwargs)
            unwrapped.train()
        n_prompt = enc["input_ids"].shape[1]
        generated = seq[:, n_prompt:]
        resp_mask = response_mask(generated, tok.eos_token_id)
        if generated.shape[1] == 0:
            raise RuntimeError("the actor generated no tokens: check max_new_tokens")
        attn = torch.cat([enc["attention_mask"], resp_mask], dim=1)
        pos = position_ids(attn)
        act_mask = resp_mask.float()  # action t of the response predicts generated[:, t]
        responses = [tok.decode(g[m.bool()], skip_special_tokens=True).strip()
                     for g, m in zip(generated, resp_mask, strict=True)]
        end_reward = torch.tensor(reward_model.score(texts, responses), device=dev, dtype=torch.float32)
        end_cost = torch.tensor(cost_model.score(texts, responses), device=dev, dtype=torch.float32)
        with torch.no_grad():
            old_logp = token_log_probs(actor, seq, attn, pos)[:, n_prompt - 1:]
            ref_logp = token_log_probs(ref, seq, attn, pos)[:, n_prompt - 1:]
            old_rv = reward_critic(seq, attn, pos)[:, n_prompt - 1:-1]
            old_cv = cost_critic(seq, attn, pos)[:, n_prompt - 1:-1]
        rewards, costs = shaped_rewards(end_reward, end_cost, old_logp, ref_logp, act_mask, s.kl_coeff,
                                        s.clip_range_score)
        adv_r, ret_r = gae(rewards, old_rv, act_mask, s.gamma, s.gae_lambda)
        adv_c, ret_c = gae(costs, old_cv, act_mask, s.gamma, s.gae_lambda)

        # the episode-cost window: the cost-model scores of the latest episodes, all processes
        window.extend(accelerator.gather(end_cost).cpu().tolist())
        episode_cost = float(np.mean(window))

        # ---- PPO updates, each after one dual step on the multiplier ---------------------------
        losses = {"actor": [], "reward_critic": [], "cost_critic": [], "ptx": [], "lambda": []}
        rng = np.random.default_rng([s.seed, step, 7])
        for _ in range(s.update_iters):
            for idx in np.array_split(rng.permutation(len(texts)), math.ceil(len(texts) / s.train_batch_size)):
                if step >= s.lambda_update_delay_steps:
                    state.log_lambda = lambda_step(state.log_lambda, episode_cost, s.threshold, s.lambda_lr,
                                                   s.lambda_max)
                lam = math.exp(state.log_lambda)
                losses["lambda"].append(lam)
                i = torch.as_tensor(idx, device=dev)
                adv = combined_advantage(adv_r[i], adv_c[i], lam)
                logp = token_log_probs(actor, seq[i], attn[i], pos[i])[:, n_prompt - 1:]
                loss = actor_loss(logp, old_logp[i], adv, act_mask[i], s.clip_range_ratio)
                accelerator.backward(loss)
                accelerator.clip_grad_norm_(actor.parameters(), s.max_grad_norm)
                actor_opt.step(), actor_sched.step(), actor_opt.zero_grad()
                losses["actor"].append(loss.item())
                for name, critic, opt, sched, old_v, ret in (
                        ("reward_critic", reward_critic, rc_opt, rc_sched, old_rv, ret_r),
                        ("cost_critic", cost_critic, cc_opt, cc_sched, old_cv, ret_c)):
                    v = critic(seq[i], attn[i], pos[i])[:, n_prompt - 1:-1]
                    vloss = value_loss(v, old_v[i], ret[i], act_mask[i], s.clip_range_value)
                    accelerator.backward(vloss)
                    accelerator.clip_grad_norm_(critic.parameters(), s.max_grad_norm)
                    opt.step(), sched.step(), opt.zero_grad()
                    losses[name].append(vloss.item())
                if ptx is not None:
                    pick = np.random.default_rng([s.seed, step, int(idx[0]), 11]).choice(
                        len(ptx), size=min(len(idx), len(ptx)), replace=False)
                    ids, mask = pad_batch([ptx[j][1] for j in pick], pad_id, "right")
                    labels = ids.masked_fill(mask == 0, -100)
                    for row, j in enumerate(pick):
                        labels[row, :ptx[j][0]] = -100
                    out_ptx = actor(input_ids=ids.to(dev), attention_mask=mask.to(dev), labels=labels.to(dev))
                    ploss = s.ptx_coeff * out_ptx.loss
                    accelerator.backward(ploss)
                    accelerator.clip_grad_norm_(actor.parameters(), s.max_grad_norm)
                    actor_opt.step(), actor_opt.zero_grad()
                    losses["ptx"].append(out_ptx.loss.item())

        # ---- log ------------------------------------------------------------------------------
        kl = ((old_logp - ref_logp) * act_mask).sum(dim=1)
        # lambda: after this rollout's dual steps; lambda_mean: the mean lambda its actor updates used
        row = {"step": step + 1, "lambda": math.exp(state.log_lambda),
               "lambda_mean": float(np.mean(losses.pop("lambda"))), "episode_cost": episode_cost,
               "threshold": s.threshold,
               "reward": accelerator.gather(end_reward).mean().item(),
               "cost": accelerator.gather(end_cost).mean().item(),
               "kl": accelerator.gather(kl).mean().item(),
               "response_length": accelerator.gather(act_mask.sum(dim=1)).mean().item()}
        row |= {f"loss_{k}": float(np.mean(v)) for k, v in losses.items() if v}
        state.history.append(row)
        state.step += 1
        state.window = list(window)
        if state.step % s.logging_steps == 0 or state.step == total:
            log.info("step %d/%d: lambda=%.4f episode_cost=%.4f (threshold %.4g) reward=%.4f cost=%.4f kl=%.4f "
                     "len=%.1f actor_loss=%.4g", state.step, total, row["lambda"], episode_cost, s.threshold,
                     row["reward"], row["cost"], row["kl"], row["response_length"], row["loss_actor"])
        if state.step % s.save_steps == 0 and state.step < total:
            _save_checkpoint(accelerator, checkpoint_dir, state)

    accelerator.wait_for_everyone()
    tail = state.history[-max(1, min(len(state.history), 10)):]
    metrics = {"steps": state.step, "n_prompts": len(prompts), "final_lambda": math.exp(state.log_lambda),
               "final_episode_cost": state.history[-1]["episode_cost"],
               "threshold": s.threshold,
               "first_steps": {k: float(np.mean([h[k] for h in state.history[:10]])) for k in ("reward", "cost", "kl")},
               "last_steps": {k: float(np.mean([h[k] for h in tail])) for k in ("reward", "cost", "kl")}}
    log.info("finished at step %d: lambda=%.4f, episode cost %.4f (threshold %.4g); reward %.4f -> %.4f, cost "
             "%.4f -> %.4f over the first/last 10 rollouts", state.step, metrics["final_lambda"],
             metrics["final_episode_cost"], s.threshold, metrics["first_steps"]["reward"],
             metrics["last_steps"]["reward"], metrics["first_steps"]["cost"], metrics["last_steps"]["cost"])
    if accelerator.is_main_process:
        save_model(accelerator.unwrap_model(actor), tok, out, kind="safe_rlhf", settings=s, inputs=inputs,
                   metrics=metrics, extra_files={"history.json": {"history": state.history}})
    accelerator.wait_for_everyone()
    return metrics


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the SFT model: actor initialisation and reference")
    parser.add_argument("--reward", required=True, help="reward model directory (also the reward critic's start)")
    parser.add_argument("--cost", required=True, help="cost model directory (also the cost critic's start)")
    parser.add_argument("--prompts", required=True, help="training prompts (parquet/jsonl with a prompt column)")
    parser.add_argument("--sft-data", default=None, help="SFT data for the ptx loss (prompt, output)")
    add_settings_arguments(parser, PPOLagSettings)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--checkpoints", required=True, help="checkpoint directory (kept across reruns)")
    parser.add_argument("--out", required=True, help="output model directory (the trained actor)")


def run(args) -> None:
    s = read_settings(args, PPOLagSettings, seed=args.seed, dtype=args.dtype)
    train_safe_rlhf(args.model, args.reward, args.cost, args.prompts, args.sft_data, args.checkpoints, args.out, s)
