"""What every training step shares: settings, trainer arguments for CPU or GPU, resuming from
the last checkpoint, progress logging, and saving a model with its settings and provenance.

Checkpoints live in a directory of their own (``results/{exp}/checkpoints/{model}``), not
inside the model's output directory: Snakemake deletes a job's outputs before rerunning
it, and a killed job must resume from its last checkpoint when rerun.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Literal

from lara.io import atomic_output, write_json
from lara.provenance import record
from lara.settings import Settings, setting

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16", "float16")
Dtype = Literal["float32", "bfloat16", "float16"]


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
    warmup_ratio: float = setting(0.0, "Linear warm-up share of the schedule.", minimum=0, maximum=1)
    weight_decay: float = setting(0.0, "AdamW weight decay.", minimum=0)
    seed: int = setting(0, "The experiment seed (config key seed).", minimum=0, config=False)
    dtype: Dtype = setting("float32", "Weight dtype (config key base_model.dtype).", config=False)


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


@dataclass(frozen=True)
class CostSettings(PreferenceSettings):
    """train.cost: the cost model on safer_response_id with Safe-RLHF's sign terms."""

    SECTION: ClassVar[str] = "train.cost"


@dataclass(frozen=True)
class PartialSettings(PreferenceSettings):
    """train.partial: PARGS partial reward/cost models on prefix pairs."""

    SECTION: ClassVar[str] = "train.partial"

    prefixes_per_pair: int | None = setting(None, "Prefix lengths sampled per pair (null = every length).",
                                            minimum=1)


@dataclass(frozen=True)
class ValueSettings(TrainSettings):
    """train.value: CD-Q value functions (and the policy samples they are trained on)."""

    SECTION: ClassVar[str] = "train.value"

    target: Literal["cdq", "fudge"] = setting("cdq", "The Bellman target (cdq) or regression on the final score "
                                                     "(fudge).")
    n_prompts: int = setting(400, "Training prompts sampled from the SFT data.", minimum=1)
    samples_per_prompt: int = setting(4, "Policy samples per training prompt.", minimum=1)


def device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def training_arguments(config_cls, s: TrainSettings, checkpoint_dir: str | Path, has_eval: bool, **extra):
    """A TRL/transformers config: checkpoints every ``save_steps`` (the last two kept), no
    external reporting, and precision set for the device (TRL defaults to bf16 and gradient
    checkpointing, which a CPU run must switch off)."""
    cuda = device() == "cuda"
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
        gradient_checkpointing=False,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **extra,
    )


def last_checkpoint(checkpoint_dir: str | Path) -> str | None:
    """The newest complete ``checkpoint-N`` in ``checkpoint_dir``. The Trainer writes a checkpoint's
    ``trainer_state.json`` last, so a job killed while saving leaves a directory without a readable
    one: such a directory is deleted (with a warning) and the one before it is resumed."""
    import shutil

    path = Path(checkpoint_dir)
    if not path.is_dir():
        return None
    found = sorted((int(p.name.split("-", 1)[1]), p) for p in path.glob("checkpoint-*")
                   if p.is_dir() and p.name.split("-", 1)[1].isdigit())
    for _, candidate in reversed(found):
        try:
            json.loads((candidate / "trainer_state.json").read_text())
            return str(candidate)
        except (OSError, ValueError):
            log.warning("%s is incomplete (killed while saving?): deleting it", candidate)
            shutil.rmtree(candidate, ignore_errors=True)
    return None


def progress_callback():
    """Trainer callback that sends every logged metric line to the step's log."""
    from transformers import TrainerCallback

    class LogProgress(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs:
                shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in logs.items())
                log.info("step %d/%d: %s", state.global_step, state.max_steps, shown)

        def on_save(self, args, state, control, **kwargs):
            log.info("checkpoint saved at step %d", state.global_step)

    return LogProgress()


def quiet_trainer(trainer):
    """Drop transformers' stdout printer: progress goes to the log through our callback."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    return trainer


def fingerprint(settings, inputs: dict[str, str | Path]) -> dict:
    """What a checkpoint must have been trained with to be resumed: the settings that can change
    the result (not how often it logs or checkpoints), and the inputs (data by content hash; a
    model directory by its provenance record, else its path)."""
    from lara.io import sha256_file

    def ident(path):
        p = Path(path)
        if p.is_file():
            return sha256_file(p)
        if (p / "provenance.json").is_file():
            return sha256_file(p / "provenance.json")
        return str(path)

    return {"settings": settings.result_settings(), "inputs": {k: ident(v) for k, v in inputs.items()}}


def discard_stale_checkpoints(checkpoint_dir: Path, fp: dict) -> None:
    """Delete ``checkpoint_dir`` when its checkpoints were made with other settings or inputs
    than ``fp``, then stamp it with ``fp``."""
    import shutil

    stamp = checkpoint_dir / "fingerprint.json"
    old = json.loads(stamp.read_text()) if stamp.is_file() else None
    new = json.loads(json.dumps(fp))
    if old is not None and old != new:
        changed = sorted(k for part in ("settings", "inputs") for k in set(old.get(part, {})) | set(new[part])
                         if old.get(part, {}).get(k) != new[part].get(k))
        log.warning("%s changed since the checkpoints in %s were made: discarding them", ", ".join(changed),
                    checkpoint_dir)
        shutil.rmtree(checkpoint_dir)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_json(stamp, fp)


def train_with_resume(trainer, checkpoint_dir: str | Path, fp: dict | None = None):
    """Run ``trainer.train``, resuming from the last checkpoint in ``checkpoint_dir`` if it was
    made with the same settings and inputs (``fp``); stale checkpoints are discarded."""
    checkpoint_dir = Path(checkpoint_dir)
    if fp is not None:
        discard_stale_checkpoints(checkpoint_dir, fp)
    resume = last_checkpoint(checkpoint_dir)
    if resume:
        log.info("resuming from %s", resume)
    else:
        log.info("no checkpoint in %s: starting from scratch", checkpoint_dir)
    result = trainer.train(resume_from_checkpoint=resume)
    log.info("finished at step %d (training loss %.4f)", trainer.state.global_step, result.training_loss)
    return result


def save_model(model, tokenizer, out_dir: str | Path, *, kind: str, settings: TrainSettings,
               inputs: dict[str, str | Path], metrics: dict, scorer: dict | None = None,
               extra_files: dict[str, dict] | None = None) -> None:
    """Save weights and tokenizer atomically, with ``training_settings.json``,
    ``metrics.json``, ``provenance.json`` and, for scorers, ``lara_scorer.json``."""
    with atomic_output(out_dir, directory=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json(Path(tmp) / "training_settings.json", {"kind": kind, **asdict(settings)})
        write_json(Path(tmp) / "metrics.json", metrics)
        write_json(Path(tmp) / "provenance.json",
                   record({"kind": kind, **asdict(settings)}, inputs=inputs, seed=settings.seed, device=device()))
        if scorer is not None:
            from lara.scoring import SCORER_FILE

            write_json(Path(tmp) / SCORER_FILE, scorer)
        for name, obj in (extra_files or {}).items():
            write_json(Path(tmp) / name, obj)
    log.info("saved %s model to %s", kind, out_dir)


def seed_everything(seed: int) -> None:
    import random

    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))


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
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--checkpoints", required=True, help="checkpoint directory (kept across reruns)")
    parser.add_argument("--out", required=True, help="output model directory")


def read_train_settings(args, settings_cls: type[TrainSettings]) -> TrainSettings:
    """The stage's settings from its arguments (``--settings`` JSON, key flags, seed, dtype)."""
    from lara.settings import read_settings

    return read_settings(args, settings_cls, seed=args.seed, dtype=args.dtype)
