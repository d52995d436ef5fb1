"""What every training step shares: settings, trainer arguments for CPU or GPU, resuming from
the last checkpoint, progress logging, and saving a model with its settings and provenance.

Checkpoints live in a directory of their own (``results/{exp}/checkpoints/{model}``), not
inside the model's output directory: Snakemake deletes a job's outputs before rerunning
it, and a killed job must resume from its last checkpoint when rerun.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Literal

from lara.io import atomic_output, write_json
from lara.provenance import record
from lara.runtime import rank, world_size
from lara.settings import Dtype, Settings, cross_key, dtype_setting, seed_setting, setting
from lara.train.checkpoints import (
    fingerprint,
    numbered,
    prune,
    publish,
    remove_interrupted_saves,
    resume_point,
    staging_dir,
)

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class TrainSettings(Settings):
    """What every TRL-trained stage reads from its train.<stage> section."""

    SECTION: ClassVar[str] = "train"

    learning_rate: float = setting(1e-3, "Peak learning rate.", exclusive_minimum=0)
    epochs: float = setting(1.0, "Training epochs.", exclusive_minimum=0)
    max_steps: int = setting(-1, "Stop after this many optimiser steps (-1 = by epochs).", minimum=-1)
    batch_size: int = setting(32, "Per-device batch size.", minimum=1)
    gradient_accumulation_steps: int = setting(1, "Batches per optimiser step.", minimum=1)
    max_length: int = setting(512, "Longest prompt + response in tokens.", minimum=8)
    eval_fraction: float = setting(0.1, "Share of the data held out for validation.", minimum=0, exclusive_maximum=1)
    save_steps: int = setting(500, "Checkpoint every this many steps (a rerun resumes from the last).", minimum=1,
                              bookkeeping=True)
    logging_steps: int = setting(10, "Log training metrics every this many steps.", minimum=1, bookkeeping=True)
    resume_partial: bool = setting(False, "Resume from a checkpoint whose optimizer or scheduler state is missing, "
                                          "with a fresh one (the run then differs from an uninterrupted one); "
                                          "otherwise such a checkpoint is set aside.", bookkeeping=True)
    warmup_ratio: float = setting(0.0, "Linear warm-up share of the schedule.", minimum=0, maximum=1)
    weight_decay: float = setting(0.0, "AdamW weight decay.", minimum=0)
    seed: int = seed_setting()
    dtype: Dtype = dtype_setting()


@dataclass(frozen=True)
class SFTSettings(TrainSettings):
    """train.sft: supervised fine-tuning (TRL SFTTrainer, loss on the completion)."""

    SECTION: ClassVar[str] = "train.sft"


@dataclass(frozen=True)
class PreferenceSettings(TrainSettings):
    """train.reward / train.cost: Bradley-Terry score models (TRL RewardTrainer)."""

    regularization: float = setting(0.0, "Coefficient of mean(score^2) added to the loss.", minimum=0)


@dataclass(frozen=True)
class RewardSettings(PreferenceSettings):
    """train.reward: the reward model on better_response_id."""

    SECTION: ClassVar[str] = "train.reward"


CostLoss = Literal["safe_rlhf", "bt"]
COST_LOSS_HELP = ("safe_rlhf: Bradley-Terry on safer_response_id plus Safe-RLHF's two sign terms, so c > 0 means "
                  "harmful (what a tau in these units, and 'safe = c <= 0', assume); bt: plain Bradley-Terry on the "
                  "harmfulness preference, the paper's stated objective (scores then have no fixed zero).")


@dataclass(frozen=True)
class CostSettings(PreferenceSettings):
    """train.cost: the cost model on safer_response_id."""

    SECTION: ClassVar[str] = "train.cost"

    loss: CostLoss = setting("safe_rlhf", COST_LOSS_HELP)
    anchor_zero: bool = setting(True, "With loss bt (no fixed zero): fit the cost scale's zero on the held-out "
                                      "pairs' safety labels, so c > 0 separates unsafe from safe responses there "
                                      "and tau has that meaning; the offset is stored with the model and applied "
                                      "wherever it scores. No effect with safe_rlhf, whose sign terms anchor it.")

    @cross_key("train.cost.anchor_zero", "train.cost.loss", "train.cost.eval_fraction",
               witness={"train": {"cost": {"loss": "bt", "anchor_zero": True, "eval_fraction": 0.0}}})
    def anchor_has_pairs(self):
        if self.loss == "bt" and self.anchor_zero and self.eval_fraction == 0:
            return (f"{self.SECTION}.anchor_zero: true fits the cost scale's zero (loss bt) on held-out pairs, but "
                    f"{self.SECTION}.eval_fraction = 0 holds none out; raise eval_fraction or set anchor_zero: false")


@dataclass(frozen=True)
class PartialSettings(PreferenceSettings):
    """train.partial: PARGS partial reward/cost models on prefix pairs."""

    SECTION: ClassVar[str] = "train.partial"

    prefixes_per_pair: int | None = setting(None, "Prefix lengths sampled per pair (null = every length).",
                                            minimum=1)
    cost_loss: CostLoss = setting("safe_rlhf", "The partial cost model's loss (as train.cost.loss). " + COST_LOSS_HELP)


@dataclass(frozen=True)
class ValueSettings(TrainSettings):
    """train.value: CD-Q value functions (and how many policy samples per data.value_prompts prompt)."""

    SECTION: ClassVar[str] = "train.value"

    target: Literal["cdq", "fudge"] = setting("cdq", "The Bellman target (cdq) or regression on the final score "
                                                     "(fudge).")
    samples_per_prompt: int = setting(4, "Policy samples per training prompt.", minimum=1)


def device() -> str:
    """This process's device: ``cuda:LOCAL_RANK`` under a multi-process launch on GPUs, ``cuda`` or ``cpu``."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    local = os.environ.get("LOCAL_RANK")
    return f"cuda:{local}" if local is not None and world_size() > 1 else "cuda"


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def ignore_trl_deprecated_reads() -> None:
    """TRL 1.16 reads transformers' deprecated ``is_gradient_checkpointing`` inside its own helpers (DPO's
    reference log-probs, unwrapping for generation): a FutureWarning in every training log that no setting of
    ours causes or can remove. Silenced by its exact message for this process; every other warning stays."""
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def training_arguments(config_cls, s: TrainSettings, checkpoint_dir: str | Path, has_eval: bool, **extra):
    """A TRL/transformers config: checkpoints every ``save_steps`` (the last two kept), no
    external reporting, and precision set for the device (TRL defaults to bf16 and gradient
    checkpointing, which a CPU run must switch off)."""
    cuda = device() == "cuda"
    ignore_trl_deprecated_reads()
    return config_cls(
        output_dir=str(checkpoint_dir),
        learning_rate=s.learning_rate,
        num_train_epochs=s.epochs,
        max_steps=s.max_steps,
        per_device_train_batch_size=s.batch_size,
        per_device_eval_batch_size=s.batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        warmup_steps=float(min(s.warmup_ratio, 0.999)),  # a float below 1 is a ratio of the schedule
        weight_decay=s.weight_decay,
        lr_scheduler_type="cosine",
        logging_steps=s.logging_steps,
        save_strategy="steps",
        save_steps=s.save_steps,
        save_total_limit=2,
        eval_strategy="epoch" if has_eval else "no",
        seed=s.seed,
        data_seed=s.seed,
        report_to=[],
        bf16=cuda and s.dtype == "bfloat16",
        fp16=cuda and s.dtype == "float16",
        use_cpu=not cuda,
        activation_checkpointing=False,  # TRL defaults to it; the old name (gradient_checkpointing) warns
        dataloader_num_workers=0,
        disable_tqdm=True,
        **extra,
    )


REQUIRED_STATE = ("trainer_state.json", "optimizer.pt", "scheduler.pt")


def _missing_state(candidate: Path) -> list[str]:
    """What a Trainer checkpoint lacks to resume exactly: its state files (a readable
    trainer_state.json, the optimizer, the scheduler) and weights."""
    missing = [name for name in REQUIRED_STATE if not (candidate / name).is_file()]
    if "trainer_state.json" not in missing:
        try:
            from lara.read.files import json_file
            json_file((candidate / "trainer_state.json"), mapping=False, finite=False)
        except (OSError, ValueError):
            missing.insert(0, "trainer_state.json (unreadable)")
    if not any(candidate.glob("*.safetensors")) and not any(candidate.glob("*.bin")):
        missing.append("model weights")
    return missing


def last_checkpoint(checkpoint_dir: str | Path, resume_partial: bool = False) -> str | None:
    """The newest complete ``checkpoint-N`` in ``checkpoint_dir``, else None; the staging folders of interrupted
    saves (:mod:`lara.train.checkpoints`) are removed. A ``checkpoint-N`` that still lacks its trainer state,
    optimizer, scheduler or weights (an older writer, or files removed by hand) is moved to ``incomplete/`` and the
    one before it is taken; with ``resume_partial`` (train.*.resume_partial) a checkpoint with weights and trainer
    state but no optimizer or scheduler is resumed instead, with a warning that the run then differs from an
    uninterrupted one."""
    import shutil

    path = Path(checkpoint_dir)
    if not path.is_dir():
        return None
    remove_interrupted_saves(path)
    for _, candidate in reversed(numbered(path)):
        missing = _missing_state(candidate)
        if not missing:
            return str(candidate)
        state_only = set(missing) <= {"optimizer.pt", "scheduler.pt"}
        if resume_partial and state_only:
            log.warning("%s lacks %s: resuming it anyway (resume_partial: true) with a FRESH optimizer/scheduler "
                        "state; the weights will differ from an uninterrupted run", candidate, ", ".join(missing))
            return str(candidate)
        aside = path / "incomplete" / candidate.name
        log.warning("%s is incomplete (missing %s): moved to %s; the checkpoint before it is resumed%s", candidate,
                    ", ".join(missing), aside.parent,
                    " (set resume_partial: true to resume it with a fresh optimizer)" if state_only else "")
        aside.parent.mkdir(exist_ok=True)
        shutil.rmtree(aside, ignore_errors=True)
        candidate.rename(aside)
        prune(aside.parent)
    return None


def stage_checkpoints(trainer) -> None:
    """Make ``trainer`` write each checkpoint into ``.staging-N`` beside the others and rename it to
    ``checkpoint-N`` only once every file is written, so a checkpoint is either complete or absent;
    then keep the newest ``save_total_limit``."""
    import shutil

    original = trainer._save_checkpoint

    def save(model, trial):
        run_dir = Path(trainer.args.output_dir)
        step = trainer.state.global_step
        staging = staging_dir(run_dir, step)
        if trainer.args.should_save:
            shutil.rmtree(staging, ignore_errors=True)
        trainer.args.output_dir = str(staging)
        try:
            original(model, trial)
        finally:
            trainer.args.output_dir = str(run_dir)
        trainer.accelerator.wait_for_everyone()
        if trainer.args.should_save:
            publish(staging / f"checkpoint-{step}", run_dir, step, trainer.args.save_total_limit)
        trainer.accelerator.wait_for_everyone()

    trainer._save_checkpoint = save


def quiet_trainer(trainer):
    """Progress to the step's log (every logged metric line, and each save), not to transformers' stdout printer."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    class LogProgress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in logs.items())
                log.info("step %d/%d: %s", state.global_step, state.max_steps, shown)

        def on_save(self, args, state, control, **kwargs):
            log.info("checkpoint saved at step %d", state.global_step)

    trainer.add_callback(LogProgress())
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def start(model_path: str, s: TrainSettings, data_path: str, required=()):
    """What a TRL-trained stage does first: ``--model`` must be a model (:func:`lara.config.require_model`), then
    every random generator is seeded with ``s.seed``. Returns the model's tokenizer (:func:`load_tokenizer`) and the
    training table at ``data_path`` (with the ``required`` columns)."""
    import random

    import numpy as np
    import torch

    from lara.config import require_model
    from lara.read.files import read_table

    require_model(model_path, "--model")
    random.seed(s.seed)
    np.random.seed(s.seed)
    torch.manual_seed(s.seed)
    os.environ.setdefault("PYTHONHASHSEED", str(s.seed))
    return load_tokenizer(model_path), read_table(data_path, required=required)


def load_tokenizer(model_path: str):
    """The model's tokenizer, padding with its EOS token where it has no pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def fit(trainer, checkpoint_dir: str | Path, s: TrainSettings, inputs: dict[str, str | Path]) -> dict:
    """Run ``trainer.train``, resuming from the last complete checkpoint in ``checkpoint_dir`` if it was made with
    the same settings and inputs (:func:`lara.train.checkpoints.resume_point`; ``s.resume_partial``: see
    :func:`last_checkpoint`); every new checkpoint is written complete or not at all (:func:`stage_checkpoints`).
    Returns the metrics every stage reports, the training loss and the last step."""
    stage_checkpoints(trainer)
    resume = resume_point(trainer.accelerator, Path(checkpoint_dir), fingerprint(s, inputs),
                          lambda path: last_checkpoint(path, resume_partial=s.resume_partial))
    result = trainer.train(resume_from_checkpoint=resume)
    log.info("finished at step %d (training loss %.4f)", trainer.state.global_step, result.training_loss)
    return {"train_loss": result.training_loss, "global_step": trainer.state.global_step}


def save_trained(trainer, tokenizer, out_dir: str | Path, metrics: dict, **kwargs) -> dict:
    """:func:`save_model` of the trainer's model, its log history added to ``metrics`` (returned)."""
    metrics["log_history"] = trainer.state.log_history
    save_model(trainer.model, tokenizer, out_dir, metrics=metrics, **kwargs)
    return metrics


def save_model(model, tokenizer, out_dir: str | Path, *, kind: str, settings: TrainSettings,
               inputs: dict[str, str | Path], metrics: dict, scorer: dict | None = None,
               extra_files: dict[str, dict] | None = None, state_dict: dict | None = None) -> None:
    """Save weights and tokenizer atomically, with ``training_settings.json``,
    ``metrics.json``, ``provenance.json`` and, for scorers, ``lara_scorer.json``. Under a
    multi-process launch only the main process writes; the others wait until it has."""
    try:
        if rank() != 0:  # the main process writes (the only one, or rank 0 of a multi-process launch)
            return
        with atomic_output(out_dir, directory=True) as tmp:
            model.save_pretrained(tmp, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
            write_json(Path(tmp) / "training_settings.json", {"kind": kind, **asdict(settings)})
            write_json(Path(tmp) / "metrics.json", metrics | {"processes": world_size()})
            write_json(Path(tmp) / "provenance.json",
                       record({"kind": kind, **asdict(settings)}, inputs=inputs, seed=settings.seed, device=device()))
            if scorer is not None:
                from lara.scoring import SCORER_FILE

                write_json(Path(tmp) / SCORER_FILE, scorer)
            for name, obj in (extra_files or {}).items():
                write_json(Path(tmp) / name, obj)
        log.info("saved %s model to %s", kind, out_dir)
    finally:  # every process of a multi-process launch waits until the main one has written
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()


def split_eval(df, fraction: float, seed: int):
    """Deterministic train/validation split of a DataFrame."""
    import numpy as np

    if fraction <= 0 or len(df) < 10:
        return df.reset_index(drop=True), df.iloc[:0]
    order = np.random.default_rng(seed).permutation(len(df))
    n_eval = max(1, int(round(len(df) * fraction)))
    return df.iloc[order[n_eval:]].reset_index(drop=True), df.iloc[order[:n_eval]].reset_index(drop=True)


def add_common_arguments(parser, settings_cls: type[TrainSettings],
                         model_help: str = "model directory or hub id to start from") -> None:
    from lara.settings import add_settings_arguments

    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--data", required=True, help="training data (parquet)")
    add_settings_arguments(parser, settings_cls)
    parser.add_argument("--checkpoints", required=True, help="checkpoint directory (kept across reruns)")
    parser.add_argument("--out", required=True, help="output model directory")
