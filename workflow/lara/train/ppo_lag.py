"""``lara train-safe-rlhf``: the Safe-RLHF baseline, PPO-Lagrangian, as the project's own loop.

TRL (>= 1.13) has no PPO trainer, and the old one had one reward model, one critic and no multiplier, so this is a
loop on ``accelerate`` that follows Safe-RLHF's algorithm (Dai et al. 2024, PKU-Alignment/safe-rlhf ``ppo_lag``),
as docs/baselines.md states it: the actor from SFT against the frozen SFT reference, the reward and cost models as
scorers of finished responses and as the starts of two token critics (each with its own GAE and clipped value
loss), the per-token streams clipped at +-clip_range_score, the dual step on log(lambda) before every actor update
(J_c the mean cost of the last ``episode_cost_window_size`` episodes; lambda rises while J_c exceeds the threshold),
the clamp, the optional ptx loss. The KL penalty is added to the reward stream and subtracted from the cost stream
(Safe-RLHF after its PR #173): with the actor's advantage (A_r - lambda A_c) / (1 + lambda) the policy sees it at
weight (kl + lambda kl) / (1 + lambda) = kl_coeff.

Every step's lambda, episode cost, reward, cost and KL are saved with the model (``history.json``). Checkpoints
(models, optimisers, schedulers, RNG state, lambda and the episode window) are written every ``save_steps``
rollouts and a rerun with the same settings and inputs resumes from the last.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lara.settings import (
    Dtype,
    Settings,
    add_settings_arguments,
    cross_key,
    dtype_setting,
    read_settings,
    seed_setting,
    setting,
)
from lara.train.ppo_math import (
    actor_loss,
    combined_advantage,
    gae,
    lambda_step,
    response_mask,
    shaped_rewards,
    token_critic_class,
    token_log_probs,
    value_loss,
)

log = logging.getLogger(__name__)

HELP = "Safe-RLHF baseline: PPO-Lagrangian with reward and cost critics (own accelerate loop)"


# the transformers schedules get_scheduler builds from warm-up and total steps alone, which is all this trainer
# gives (reduce_lr_on_plateau, cosine_with_min_lr, warmup_stable_decay and greedy need more; tests/unit/
# test_config_judged.py builds each of these with the installed transformers)
SCHEDULERS = ("linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup",
              "inverse_sqrt")


@dataclass(frozen=True)
class PPOLagSettings(Settings):
    """train.safe_rlhf. Defaults follow Safe-RLHF's published ``scripts/ppo-lag.sh``. The cost budget is
    calibration.tau, not a key of its own: the paper holds Safe-RLHF to the τ LARA is held to, so Fig. 2
    compares the two at one budget (changing τ retrains this baseline)."""

    SECTION: ClassVar[str] = "train.safe_rlhf"

    threshold: float = setting(help="Cost budget d of E[c] <= d, in cost-model units: LARA's tau.",
                               key="calibration.tau")

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
    lambda_init: float = setting(1.0, "Initial Lagrange multiplier.", exclusive_minimum=0)
    lambda_lr: float = setting(0.1, "SGD learning rate of log(lambda).", exclusive_minimum=0)
    lambda_clamp: float | None = setting(5.0, "Upper clamp of lambda (null = none; Safe-RLHF's --lambda_max).",
                                         exclusive_minimum=0)
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
    seed: int = seed_setting()
    dtype: Dtype = dtype_setting()

    @cross_key("train.safe_rlhf.lr_scheduler", "train.safe_rlhf.critic_lr_scheduler",
               witness={"train": {"safe_rlhf": {"lr_scheduler": "cosin"}}})
    def schedules_known(self):
        unknown = [f"train.safe_rlhf.{k}: {v!r}" for k, v in (("lr_scheduler", self.lr_scheduler),
                                                               ("critic_lr_scheduler", self.critic_lr_scheduler))
                   if v not in SCHEDULERS]
        if unknown:
            return (f"{'; '.join(unknown)} is not a transformers learning-rate schedule (one of "
                    f"{', '.join(SCHEDULERS)})")


# ---------------------------------------------------------------------------------------------
# The loop


@dataclass
class LoopState:
    step: int
    log_lambda: float
    window: list[float]
    history: list[dict]


def _save_checkpoint(accelerator, checkpoint_dir: Path, state: LoopState, keep: int = 2) -> None:
    """Save into ``.staging-N`` and rename to ``checkpoint-N`` once complete (loop_state.json last),
    so a checkpoint is either complete or absent; keep the newest ``keep``."""
    from lara.train.checkpoints import publish, staging_dir

    staging = staging_dir(checkpoint_dir, state.step)
    if accelerator.is_main_process:
        shutil.rmtree(staging, ignore_errors=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(staging))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (staging / "loop_state.json").write_text(json.dumps(asdict(state)))
        publish(staging, checkpoint_dir, state.step, keep)
    accelerator.wait_for_everyone()
    log.info("checkpoint saved at step %d", state.step)


def _last_checkpoint(checkpoint_dir: Path) -> Path | None:
    """The newest checkpoint with its loop state (the last file a save writes), once interrupted saves are removed."""
    from lara.train.checkpoints import numbered, remove_interrupted_saves

    remove_interrupted_saves(checkpoint_dir)
    done = [p for _, p in numbered(checkpoint_dir) if (p / "loop_state.json").is_file()]
    return done[-1] if done else None


@dataclass
class Run:
    """What one PPO-Lagrangian run holds: settings, accelerator, tokenizer, prompts, the actor, the
    frozen reference, both critics, the reward and cost scorers, the optimisers, the ptx data."""

    s: PPOLagSettings
    accelerator: Any
    tok: Any
    prompts: list[str]
    actor: Any
    ref: Any
    critics: dict  # reward_critic / cost_critic -> the token critic (initialised from that score model)
    scorers: dict  # reward / cost -> the score model of finished responses
    optimisers: dict  # name -> (optimiser, scheduler): actor, reward_critic, cost_critic
    ptx: list[tuple[int, list[int]]] | None  # (prompt length, prompt + response ids) per SFT example
    steps_per_epoch: int
    total: int
    inputs: dict
    dev: Any  # the accelerator's device
    world: int  # its processes


def _setup(sft_path: str, reward_path: str, cost_path: str, prompts_path: str, sft_data_path: str | None,
           s: PPOLagSettings) -> Run:
    """Models, scorers, optimisers (with their schedules over the whole run) and the ptx data."""
    import torch
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, get_scheduler
    from trl.trainer.utils import disable_dropout_in_model

    from lara.read.files import read_table
    from lara.scoring import SequenceScorer, encode
    from lara.template import format_prompt
    from lara.train.common import load_tokenizer, torch_dtype

    cuda = torch.cuda.is_available()
    mixed = {"bfloat16": "bf16", "float16": "fp16"}.get(s.dtype, "no") if cuda else "no"
    # the schedules count optimiser updates of the whole job: accelerate's default would advance a prepared
    # scheduler once per process at every step (it assumes a dataloader split across processes)
    accelerator = Accelerator(cpu=not cuda, mixed_precision=mixed, step_scheduler_with_optimizer=False)
    set_seed(s.seed)
    dev = accelerator.device
    log.info("accelerate: %s, %d process(es) on %s, mixed precision %s", accelerator.distributed_type.value,
             accelerator.num_processes, dev, accelerator.mixed_precision)
    frozen_dtype = torch_dtype(s.dtype) if cuda else torch.float32

    prompts_df = read_table(prompts_path, required=("prompt",))
    prompts = list(dict.fromkeys(str(p) for p in prompts_df["prompt"]))  # distinct, in order
    tok = load_tokenizer(sft_path)
    tok.padding_side = "left"

    scored = {"reward": reward_path, "cost": cost_path}
    actor = AutoModelForCausalLM.from_pretrained(sft_path, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(sft_path, dtype=frozen_dtype).to(dev).eval().requires_grad_(False)
    TokenCritic = token_critic_class()
    models = {"actor": actor} | {f"{k}_critic": TokenCritic(AutoModelForSequenceClassification.from_pretrained(
        path, dtype=torch.float32)) for k, path in scored.items()}
    for m in models.values():
        disable_dropout_in_model(m)
    scorers = {k: SequenceScorer(path, device=str(dev), dtype=s.dtype if cuda else "float32")
               for k, path in scored.items()}

    world = accelerator.num_processes
    steps_per_epoch = max(1, len(prompts) // (s.prompt_batch_size * world))
    total = s.max_steps if s.max_steps > 0 else max(1, math.ceil(s.epochs * steps_per_epoch))
    updates_per_step = s.update_iters * math.ceil(s.prompt_batch_size / s.train_batch_size)

    def optimiser(name, model):
        lr, wd, schedule = ((s.actor_lr, s.actor_weight_decay, s.lr_scheduler) if name == "actor" else
                            (s.critic_lr, s.critic_weight_decay, s.critic_lr_scheduler))
        opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
        return opt, get_scheduler(schedule, opt, num_warmup_steps=int(s.warmup_ratio * total * updates_per_step),
                                  num_training_steps=total * updates_per_step)

    # prepared together, in the order actor, its optimiser and schedule, then each critic's (the checkpoints' order)
    prepared = accelerator.prepare(*(x for name, m in models.items() for x in (m, *optimiser(name, m))))
    models = {name: prepared[3 * i] for i, name in enumerate(models)}
    optimisers = {name: tuple(prepared[3 * i + 1:3 * i + 3]) for i, name in enumerate(models)}

    ptx = None
    if s.ptx_coeff > 0 and sft_data_path:
        sft_df = read_table(sft_data_path, required=("prompt", "output"))
        longest = s.max_prompt_length + s.max_new_tokens
        ptx = [(len(tok(format_prompt(p))["input_ids"]), encode(tok, p, o, True, longest))
               for p, o in zip(sft_df["prompt"], sft_df["output"], strict=True)]
    inputs = {"sft": sft_path, **scored, "prompts": prompts_path} | ({} if ptx is None else {"sft_data": sft_data_path})
    return Run(s=s, accelerator=accelerator, tok=tok, prompts=prompts, actor=models.pop("actor"), ref=ref,
               critics=models, scorers=scorers, optimisers=optimisers, ptx=ptx, steps_per_epoch=steps_per_epoch,
               total=total, inputs=inputs, dev=dev, world=world)


def _resume(run: Run, checkpoint_dir: Path) -> LoopState:
    """The loop state of the last complete checkpoint made with these settings and inputs, else step 0."""
    from lara.train.checkpoints import fingerprint, resume_point

    resume = resume_point(run.accelerator, checkpoint_dir, fingerprint(run.s, run.inputs), _last_checkpoint)
    if resume is None:
        return LoopState(step=0, log_lambda=math.log(run.s.lambda_init), window=[], history=[])
    run.accelerator.load_state(str(resume))
    from lara.read.files import json_file
    return LoopState(**json_file((resume / "loop_state.json"), mapping=False))


def _batch_prompts(run: Run, step: int) -> list[str]:
    """This process's prompts of rollout ``step`` (a seeded permutation per epoch)."""
    s = run.s
    epoch, within = divmod(step, run.steps_per_epoch)
    order = np.random.default_rng([s.seed, epoch]).permutation(len(run.prompts))
    lo = (within * run.world + run.accelerator.process_index) * s.prompt_batch_size
    return [run.prompts[i] for i in order[lo:lo + s.prompt_batch_size]]


@dataclass
class Rollout:
    """One rollout: the sequences, their masks, end scores, log-probs, values and GAE advantages."""

    texts: list[str]
    seq: Any
    attn: Any
    pos: Any
    n_prompt: int
    act_mask: Any
    ends: dict  # reward / cost -> (B,) end scores of the responses
    old_logp: Any
    ref_logp: Any
    old_values: dict  # reward_critic / cost_critic -> (B, T) values at the response actions
    advantages: dict  # reward_critic / cost_critic -> (advantages, returns)


def _rollout(run: Run, step: int) -> Rollout:
    """Generate responses to this step's prompts, score them, and compute the shaped rewards and GAE."""
    import torch
    from trl.models.utils import unwrap_model_for_generation

    from lara.scoring import position_ids
    from lara.template import format_prompt
    from lara.train.common import ignore_trl_deprecated_reads

    s, tok, dev = run.s, run.tok, run.dev
    texts = _batch_prompts(run, step)
    enc = tok([format_prompt(p) for p in texts], return_tensors="pt", padding=True, truncation=True,
              max_length=s.max_prompt_length, add_special_tokens=True).to(dev)
    gen_kwargs = dict(do_sample=True, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                      max_new_tokens=s.max_new_tokens, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(s.seed * 1_000_003 + step * run.world + run.accelerator.process_index)
    ignore_trl_deprecated_reads()
    with torch.no_grad(), unwrap_model_for_generation(run.actor, run.accelerator) as unwrapped:
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
    ends = {k: torch.tensor(m.score(texts, responses), device=dev, dtype=torch.float32)
            for k, m in run.scorers.items()}
    with torch.no_grad():
        old_logp = token_log_probs(run.actor, seq, attn, pos)[:, n_prompt - 1:]
        ref_logp = token_log_probs(run.ref, seq, attn, pos)[:, n_prompt - 1:]
        old_values = {name: critic(seq, attn, pos)[:, n_prompt - 1:-1] for name, critic in run.critics.items()}
    streams = shaped_rewards(ends["reward"], ends["cost"], old_logp, ref_logp, act_mask, s.kl_coeff,
                             s.clip_range_score)
    return Rollout(texts=texts, seq=seq, attn=attn, pos=pos, n_prompt=n_prompt, act_mask=act_mask, ends=ends,
                   old_logp=old_logp, ref_logp=ref_logp, old_values=old_values,
                   advantages={name: gae(stream, old_values[name], act_mask, s.gamma, s.gae_lambda)
                               for name, stream in zip(old_values, streams, strict=True)})


def _actor_and_critic_step(run: Run, ro: Rollout, i, lam: float, losses: dict) -> None:
    """The PPO clipped-surrogate step of the actor on (A_r - lambda A_c) / (1 + lambda), then each
    critic's clipped value step, on minibatch ``i``."""
    s, acc = run.s, run.accelerator
    adv = combined_advantage(ro.advantages["reward_critic"][0][i], ro.advantages["cost_critic"][0][i], lam)
    logp = token_log_probs(run.actor, ro.seq[i], ro.attn[i], ro.pos[i])[:, ro.n_prompt - 1:]
    loss = actor_loss(logp, ro.old_logp[i], adv, ro.act_mask[i], s.clip_range_ratio)
    acc.backward(loss)
    acc.clip_grad_norm_(run.actor.parameters(), s.max_grad_norm)
    opt, sched = run.optimisers["actor"]
    opt.step(), sched.step(), opt.zero_grad()
    losses["actor"].append(loss.item())
    for name, critic in run.critics.items():
        v = critic(ro.seq[i], ro.attn[i], ro.pos[i])[:, ro.n_prompt - 1:-1]
        vloss = value_loss(v, ro.old_values[name][i], ro.advantages[name][1][i], ro.act_mask[i], s.clip_range_value)
        acc.backward(vloss)
        acc.clip_grad_norm_(critic.parameters(), s.max_grad_norm)
        opt, sched = run.optimisers[name]
        opt.step(), sched.step(), opt.zero_grad()
        losses[name].append(vloss.item())


def _ptx_step(run: Run, step: int, minibatch: int, size: int, losses: dict) -> None:
    """The pre-training (SFT) loss on a seeded draw of SFT examples, one actor step (no schedule step).

    The draw is one per minibatch of the whole job (``size`` examples per process), each process
    taking its share, so N processes train on the same examples as one process with N times the batch."""
    from trl.trainer.utils import selective_log_softmax

    from lara.scoring import pad_batch

    s, dev, world, rank = run.s, run.dev, run.world, run.accelerator.process_index
    drawn = np.random.default_rng([s.seed, step, minibatch, 11]).choice(
        len(run.ptx), size=min(size * world, len(run.ptx)), replace=False)
    pick = np.array_split(drawn, world)[rank]
    ids, mask = pad_batch([run.ptx[j][1] for j in pick], run.tok.pad_token_id, "right")
    labels = ids.masked_fill(mask == 0, -100)
    for row, j in enumerate(pick):
        labels[row, :run.ptx[j][0]] = -100
    # the mean negative log-likelihood over the response tokens of all processes' examples: each process
    # divides its sum by the job's token count and scales by the process count, which the gradient
    # averaging across processes undoes (one process: the usual token mean)
    logits = run.actor(input_ids=ids.to(dev), attention_mask=mask.to(dev), use_cache=False).logits[:, :-1].float()
    targets, counted = labels[:, 1:].to(dev), (labels[:, 1:] != -100).to(dev)
    nll = -(selective_log_softmax(logits, targets.clamp(min=0)) * counted).sum()
    tokens = run.accelerator.reduce(counted.sum().float(), reduction="sum").clamp(min=1)
    loss = nll / tokens * world
    run.accelerator.backward(s.ptx_coeff * loss)
    run.accelerator.clip_grad_norm_(run.actor.parameters(), s.max_grad_norm)
    opt, _ = run.optimisers["actor"]
    opt.step(), opt.zero_grad()
    losses["ptx"].append(loss.item())


def _update(run: Run, ro: Rollout, state: LoopState, step: int, episode_cost: float) -> dict:
    """PPO epochs over the rollout's minibatches, each after one dual step on the multiplier."""
    import torch

    s = run.s
    losses = {"actor": [], "reward_critic": [], "cost_critic": [], "ptx": [], "lambda": []}
    rng = np.random.default_rng([s.seed, step, 7])
    minibatch = 0
    for _ in range(s.update_iters):
        for idx in np.array_split(rng.permutation(len(ro.texts)), math.ceil(len(ro.texts) / s.train_batch_size)):
            if step >= s.lambda_update_delay_steps:  # one SGD step on log(lambda) before each actor update
                state.log_lambda = lambda_step(state.log_lambda, episode_cost, s.threshold, s.lambda_lr,
                                               s.lambda_clamp)
            lam = math.exp(state.log_lambda)
            losses["lambda"].append(lam)
            _actor_and_critic_step(run, ro, torch.as_tensor(idx, device=run.dev), lam, losses)
            if run.ptx is not None:
                _ptx_step(run, step, minibatch, len(idx), losses)
            minibatch += 1
    return losses


def _history_row(run: Run, ro: Rollout, state: LoopState, step: int, episode_cost: float, losses: dict) -> dict:
    """What the rollout did: lambda (after its dual steps and their mean), episode cost, reward, cost, KL."""
    import torch

    gather = run.accelerator.gather
    kl = ((ro.old_logp - ro.ref_logp) * ro.act_mask).sum(dim=1)
    row = {"step": step + 1, "lambda": math.exp(state.log_lambda),
           "lambda_mean": float(np.mean(losses.pop("lambda"))), "episode_cost": episode_cost,
           "threshold": run.s.threshold,
           **{k: gather(v).mean().item() for k, v in ro.ends.items()},
           "kl": gather(kl).mean().item(),
           "response_length": gather(ro.act_mask.sum(dim=1)).mean().item()}
    # each loss averaged over this process's minibatches, then over the processes (as their gradients are)
    names = [k for k, v in losses.items() if v]
    local = torch.tensor([float(np.mean(losses[k])) for k in names], device=run.dev, dtype=torch.float64)
    means = run.accelerator.reduce(local, reduction="mean").tolist() if names else []
    return row | {f"loss_{k}": m for k, m in zip(names, means, strict=True)}


def _finish(run: Run, state: LoopState, out: str) -> dict:
    """Summary metrics, and the actor saved with its settings, provenance and per-step history."""
    from lara.train.common import save_model

    s = run.s
    run.accelerator.wait_for_everyone()
    tail = state.history[-max(1, min(len(state.history), 10)):]
    metrics = {"steps": state.step, "n_prompts": len(run.prompts), "final_lambda": math.exp(state.log_lambda),
               "final_episode_cost": state.history[-1]["episode_cost"],
               "threshold": s.threshold,
               "first_steps": {k: float(np.mean([h[k] for h in state.history[:10]])) for k in ("reward", "cost", "kl")},
               "last_steps": {k: float(np.mean([h[k] for h in tail])) for k in ("reward", "cost", "kl")}}
    log.info("finished at step %d: lambda=%.4f, episode cost %.4f (threshold %.4g); reward %.4f -> %.4f, cost "
             "%.4f -> %.4f over the first/last 10 rollouts", state.step, metrics["final_lambda"],
             metrics["final_episode_cost"], s.threshold, metrics["first_steps"]["reward"],
             metrics["last_steps"]["reward"], metrics["first_steps"]["cost"], metrics["last_steps"]["cost"])
    # a sharded actor (FSDP) is gathered whole first, by every process; save_model writes on the main one only
    full = run.accelerator.get_state_dict(run.actor) if run.accelerator.distributed_type.value == "FSDP" else None
    save_model(run.accelerator.unwrap_model(run.actor), run.tok, out, kind="safe_rlhf", settings=s,
               inputs=run.inputs, metrics=metrics, extra_files={"history.json": {"history": state.history}},
               state_dict=full)
    return metrics


def train_safe_rlhf(sft_path: str, reward_path: str, cost_path: str, prompts_path: str, sft_data_path: str | None,
                    checkpoints: str, out: str, s: PPOLagSettings) -> dict:
    """The loop: rollout, the episode-cost window, PPO updates with the dual steps, logging, checkpoints."""
    run = _setup(sft_path, reward_path, cost_path, prompts_path, sft_data_path, s)
    checkpoint_dir = Path(checkpoints)
    state = _resume(run, checkpoint_dir)
    window = deque(state.window, maxlen=s.episode_cost_window_size)
    log.info("PPO-Lagrangian: %d prompts, %d rollouts of %d prompts x %d processes, threshold %.4g, lambda_0 %.4g",
             len(run.prompts), run.total, s.prompt_batch_size, run.world, s.threshold, math.exp(state.log_lambda))
    while state.step < run.total:
        step = state.step
        ro = _rollout(run, step)
        # the episode-cost window: the cost-model scores of the latest episodes, all processes
        window.extend(run.accelerator.gather(ro.ends["cost"]).cpu().tolist())
        episode_cost = float(np.mean(window))
        losses = _update(run, ro, state, step, episode_cost)
        row = _history_row(run, ro, state, step, episode_cost, losses)
        state.history.append(row)
        state.step += 1
        state.window = list(window)
        if state.step % s.logging_steps == 0 or state.step == run.total:
            log.info("step %d/%d: lambda=%.4f episode_cost=%.4f (threshold %.4g) reward=%.4f cost=%.4f kl=%.4f "
                     "len=%.1f actor_loss=%.4g", state.step, run.total, row["lambda"], episode_cost, s.threshold,
                     row["reward"], row["cost"], row["kl"], row["response_length"], row["loss_actor"])
        if state.step % s.save_steps == 0 and state.step < run.total:
            _save_checkpoint(run.accelerator, checkpoint_dir, state)
    return _finish(run, state, out)


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the SFT model: actor initialisation and reference")
    parser.add_argument("--reward", required=True, help="reward model directory (also the reward critic's start)")
    parser.add_argument("--cost", required=True, help="cost model directory (also the cost critic's start)")
    parser.add_argument("--prompts", required=True, help="training prompts (parquet/jsonl with a prompt column)")
    parser.add_argument("--sft-data", default=None, help="SFT data for the ptx loss (prompt, output)")
    add_settings_arguments(parser, PPOLagSettings)
    parser.add_argument("--checkpoints", required=True, help="checkpoint directory (kept across reruns)")
    parser.add_argument("--out", required=True, help="output model directory (the trained actor)")


def run(args) -> None:
    from lara.config import require_model

    s = read_settings(args, PPOLagSettings)
    for flag, spec in (("--model", args.model), ("--reward", args.reward), ("--cost", args.cost)):
        require_model(spec, flag)
    train_safe_rlhf(args.model, args.reward, args.cost, args.prompts, args.sft_data, args.checkpoints, args.out, s)
