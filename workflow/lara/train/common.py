"""What every training step shares: settings, trainer arguments for CPU or GPU, resuming from
the last checkpoint, progress logging, and saving a model with its settings and provenance.

Checkpoints live in a directory of their own (``results/{exp}/checkpoints/{model}``), not
inside the model's output directory: Snakemake deletes a job's outputs before rerunning
it, and a killed job must resume from its last checkpoint when rerun.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from lara.io import atomic_output, write_json
from lara.provenance import record

log = logging.getLogger(__name__)

def settings_from_json(cls, text: str, section: str, **overrides):
    """A settings dataclass from the JSON of a config section, refusing unknown keys."""
    data = json.loads(text) if text else {}
    unknown = sorted(set(data) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"unknown {section} settings: {', '.join(unknown)}")
    return cls(**(data | overrides))


@dataclass(frozen=True)
class TrainSettings:
    learning_rate: float = 1e-3
    epochs: float = 1.0
    max_steps: int = -1
    batch_size: int = 32
    gradient_accumulation_steps: int = 1
    max_length: int = 512
    eval_fraction: float = 0.1
    save_steps: int = 500
    logging_steps: int = 10
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    regularization: float = 0.0
    prefixes_per_pair: int | None = None
    target: str = "cdq"
    n_prompts: int = 400
    samples_per_prompt: int = 4
    seed: int = 0
    dtype: str = "float32"

    @classmethod
    def from_json(cls, text: str, **overrides) -> TrainSettings:
        return settings_from_json(cls, text, "training", **overrides)


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
    from transformers.trainer_utils import get_last_checkpoint

    path = Path(checkpoint_dir)
    return get_last_checkpoint(str(path)) if path.is_dir() else None


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


def fingerprint(settings: TrainSettings, inputs: dict[str, str | Path]) -> dict:
    """What a checkpoint must have been trained with to be resumed: the settings, and the
    inputs (data by content hash; a model directory by its provenance record, else its path)."""
    from lara.io import sha256_file

    def ident(path):
        p = Path(path)
        if p.is_file():
            return sha256_file(p)
        if (p / "provenance.json").is_file():
            return sha256_file(p / "provenance.json")
        return str(path)

    return {"settings": asdict(settings), "inputs": {k: ident(v) for k, v in inputs.items()}}


def discard_stale_checkpoints(checkpoint_dir: Path, fp: dict) -> None:
    """Delete ``checkpoint_dir`` when its checkpoints were made with other settings or inputs
    than ``fp``, then stamp it with ``fp``."""
    import shutil

    stamp = checkpoint_dir / "fingerprint.json"
    if stamp.is_file() and json.loads(stamp.read_text()) != json.loads(json.dumps(fp)):
        log.warning("settings or inputs changed since the checkpoints in %s were made: discarding them",
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


def add_common_arguments(parser, model_help: str = "model directory or hub id to start from") -> None:
    parser.add_argument("--model", required=True, help=model_help)
    parser.add_argument("--data", required=True, help="training data (parquet)")
    parser.add_argument("--settings", default="{}", help="JSON of the config's train.<stage> section")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--checkpoints", required=True, help="checkpoint directory (kept across reruns)")
    parser.add_argument("--out", required=True, help="output model directory")
