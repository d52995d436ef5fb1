"""The pieces of the PPO-Lagrangian (:mod:`lara.train.ppo_lag`): the algorithm as pure torch functions, tested
against hand-computed values (tests/unit/test_baselines.py), and the two model reads the loop makes (per-token
log-probabilities, a critic read at every position)."""

from __future__ import annotations

import math

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
                lambda_clamp: float | None) -> float:
    """One SGD step of log(lambda) on the loss -(J_c - threshold) * lambda, then the clamp.

    d loss / d log(lambda) = -(J_c - threshold) * lambda, so
    log(lambda) <- log(lambda) + lr * (J_c - threshold) * lambda."""
    new = log_lambda + lr * (episode_cost - threshold) * math.exp(log_lambda)
    if lambda_clamp is not None:
        new = min(new, math.log(lambda_clamp))
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


def token_critic_class():
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
