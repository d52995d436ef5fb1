"""``lara train-safedpo``: the SafeDPO baseline (Kim et al. 2025) with TRL's DPOTrainer (docs/baselines.md: the
safety-aware pair order, :func:`safedpo_pairs`, and the loss with its margin Delta on safe-over-unsafe pairs).

TRL's DPOTrainer has no per-example margin, so the margin enters through the precomputed
reference log-probabilities: shifting log pi_ref(y_w) by Delta * (h(y_l) - h(y_w)) / beta
(h = 1 for an unsafe response) turns its sigmoid loss into exactly SafeDPO's (``SafeDPOTrainer``).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from lara.settings import new_default, read_settings, setting
from lara.template import format_prompt
from lara.train import common

log = logging.getLogger(__name__)

HELP = "SafeDPO baseline: DPO on safety-transformed PKU-SafeRLHF pairs with a safety margin (TRL DPOTrainer)"

BOTH_UNSAFE_RULES = ("drop", "keep")


def safedpo_pairs(df: pd.DataFrame, both_unsafe: str = "drop") -> tuple[pd.DataFrame, dict]:
    """The SafeDPO transformation of PKU-SafeRLHF rows: a pair is kept when its helpfulness-preferred response
    y_w is safe (whatever the other, y_l, is), swapped when y_w is unsafe and y_l safe (the safe response becomes
    the winner); when both are unsafe, ``both_unsafe`` ``drop`` removes it and ``keep`` keeps the helpfulness
    order (see docs/baselines.md for the paper's choice).

    Returns (pairs, counts): ``pairs`` has prompt, chosen, rejected, chosen_unsafe,
    rejected_unsafe and ``margin_indicator`` = h(rejected) - h(chosen) (1 when a safe response
    beats an unsafe one, else 0); ``counts`` says how many pairs were kept, swapped, dropped.
    """
    if both_unsafe not in BOTH_UNSAFE_RULES:
        raise ValueError(f"train.safedpo.both_unsafe must be one of {BOTH_UNSAFE_RULES}, not {both_unsafe!r}")
    rows = np.arange(len(df))
    responses = df[["response_0", "response_1"]].to_numpy()
    unsafe = ~df[["is_response_0_safe", "is_response_1_safe"]].to_numpy().astype(bool)
    w = df["better_response_id"].to_numpy().astype(int)
    swap = unsafe[rows, w] & ~unsafe[rows, 1 - w]  # an unsafe winner over a safe loser
    keep = ~(unsafe[rows, w] & unsafe[rows, 1 - w]) if both_unsafe == "drop" else np.ones(len(df), dtype=bool)
    counts = {"kept": int((keep & ~swap).sum()), "swapped": int(swap.sum()), "dropped_both_unsafe": int((~keep).sum())}
    rows, w = rows[keep], np.where(swap, 1 - w, w)[keep]
    h_w, h_l = unsafe[rows, w].astype(int), unsafe[rows, 1 - w].astype(int)
    return pd.DataFrame({"prompt": df["prompt"].to_numpy()[keep], "chosen": responses[rows, w],
                         "rejected": responses[rows, 1 - w], "chosen_unsafe": h_w, "rejected_unsafe": h_l,
                         "margin_indicator": h_l - h_w}), counts


@dataclass(frozen=True)
class SafeDPOSettings(common.TrainSettings):
    """train.safedpo. Defaults: the SafeDPO paper's PKU-SafeRLHF settings (beta 0.1, Delta 10, lr 1e-6,
    3 epochs)."""

    SECTION: ClassVar[str] = "train.safedpo"

    learning_rate: float = new_default(common.TrainSettings, "learning_rate", 1e-6)
    epochs: float = new_default(common.TrainSettings, "epochs", 3.0)
    batch_size: int = new_default(common.TrainSettings, "batch_size", 8)
    eval_fraction: float = new_default(common.TrainSettings, "eval_fraction", 0.0)
    warmup_ratio: float = new_default(common.TrainSettings, "warmup_ratio", 0.03)
    weight_decay: float = new_default(common.TrainSettings, "weight_decay", 0.05)
    beta: float = setting(0.1, "DPO inverse temperature beta.", exclusive_minimum=0)
    delta: float = setting(10.0, "Safety margin Delta, subtracted from the logit of safe-over-unsafe pairs.",
                           minimum=0)
    both_unsafe: Literal["drop", "keep"] = setting("drop", "Pairs whose responses are both unsafe: dropped "
                                                           "(SafeDPO) or kept.")


def _trainer_class():
    from trl import DPOTrainer

    class SafeDPOTrainer(DPOTrainer):
        """DPOTrainer whose precomputed reference log-probs of the chosen responses are shifted by
        Delta * margin_indicator / beta, which adds the SafeDPO margin to the sigmoid loss."""

        def __init__(self, *args, safety_delta: float = 0.0, **kwargs):
            self.safety_delta = safety_delta
            super().__init__(*args, **kwargs)

        def _precompute_ref_logps(self, dataset, name, batch_size):
            dataset = super()._precompute_ref_logps(dataset, name, batch_size)
            shift = self.safety_delta / self.beta

            def add_margin(example):
                return {"ref_chosen_logps": example["ref_chosen_logps"] + shift * example["margin_indicator"]}

            # in memory: under several processes a cached map result would be written to one process's
            # temporary folder and looked for there by the others
            return dataset.map(add_margin, desc=f"Adding the SafeDPO margin to the {name} dataset",
                               keep_in_memory=True)

    return SafeDPOTrainer


def dpo_dataset(pairs: pd.DataFrame):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [format_prompt(p) for p in pairs["prompt"]],
                              "chosen": [" " + str(c).strip() for c in pairs["chosen"]],
                              "rejected": [" " + str(c).strip() for c in pairs["rejected"]],
                              "margin_indicator": [float(m) for m in pairs["margin_indicator"]]})


@contextlib.contextmanager
def _on_disk(datasets: dict, checkpoints: Path):
    """The datasets saved to a folder every process reads (inside ``checkpoints``), for the trainer's set-up.

    DPOTrainer caches the precomputed reference log-probs in a file beside the dataset's own files, written
    by the main process and read by all; a dataset built in memory has its files in a temporary folder of
    each process, where the other processes do not find them. The folder is removed afterwards (and a
    leftover of a killed run at the next start)."""
    import shutil
    import tempfile

    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list
    from datasets import load_from_disk

    state = PartialState()
    holder = [None]
    if state.is_main_process:
        checkpoints.mkdir(parents=True, exist_ok=True)
        for old in checkpoints.glob(".datasets-*"):
            shutil.rmtree(old, ignore_errors=True)
        holder = [tempfile.mkdtemp(prefix=".datasets-", dir=checkpoints)]
        for name, ds in datasets.items():
            if ds is not None:
                ds.save_to_disk(str(Path(holder[0]) / name))
    if state.num_processes > 1:
        broadcast_object_list(holder, from_process=0)
    state.wait_for_everyone()
    try:
        yield {name: None if ds is None else load_from_disk(str(Path(holder[0]) / name))
               for name, ds in datasets.items()}
    finally:
        state.wait_for_everyone()
        if state.is_main_process:
            shutil.rmtree(holder[0], ignore_errors=True)


def train_safedpo(model_path: str, data_path: str, checkpoints: str, out: str, s: SafeDPOSettings) -> dict:
    from transformers import AutoModelForCausalLM
    from trl import DPOConfig

    tokenizer, df = common.start(model_path, s, data_path, ("prompt", "response_0", "response_1", "better_response_id",
                                                            "is_response_0_safe", "is_response_1_safe"))
    pairs, counts = safedpo_pairs(df, s.both_unsafe)
    if pairs.empty:
        raise ValueError(f"{data_path}: no pairs left after the SafeDPO transformation ({counts})")
    log.info("SafeDPO transformation of %d pairs: %s; %d pairs carry the safety margin", len(df), counts,
             int(pairs["margin_indicator"].sum()))
    train_df, eval_df = common.split_eval(pairs, s.eval_fraction, s.seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=common.torch_dtype(s.dtype))
    args = common.training_arguments(DPOConfig, s, checkpoints, has_eval=len(eval_df) > 0, beta=s.beta,
                                     loss_type=["sigmoid"], max_length=s.max_length, precompute_ref_log_probs=True,
                                     remove_unused_columns=True)
    with _on_disk({"train": dpo_dataset(train_df), "eval": dpo_dataset(eval_df) if len(eval_df) else None},
                  Path(checkpoints)) as data:
        trainer = common.quiet_trainer(_trainer_class()(
            model=model, args=args, train_dataset=data["train"], eval_dataset=data["eval"], processing_class=tokenizer,
            safety_delta=s.delta))
    inputs = {"sft": model_path, "data": data_path}
    metrics = {"n_pairs": len(df), "transform": counts, "n_train": len(train_df), "n_eval": len(eval_df),
               "n_margin": int(pairs["margin_indicator"].sum())} | common.fit(trainer, checkpoints, s, inputs)
    return common.save_trained(trainer, tokenizer, out, metrics, kind="safedpo", settings=s, inputs=inputs)


def add_arguments(parser) -> None:
    common.add_common_arguments(parser, SafeDPOSettings,
                                model_help="the SFT model (policy initialisation and reference)")


def run(args) -> None:
    s = read_settings(args, SafeDPOSettings)
    train_safedpo(args.model, args.data, args.checkpoints, args.out, s)
