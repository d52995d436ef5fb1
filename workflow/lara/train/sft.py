"""``lara train-sft``: supervised fine-tuning of the base model with TRL's SFTTrainer.

Prompt/completion format: the prompt is the user turn in the Safe-RLHF template, the
completion the reference answer (TRL appends EOS); the loss is on the completion only.
"""

from __future__ import annotations

import logging

import pandas as pd

from lara.settings import read_settings
from lara.template import format_prompt
from lara.train import common

log = logging.getLogger(__name__)

HELP = "supervised fine-tuning of the base model on Alpaca-schema data (TRL SFTTrainer)"


def sft_dataset(df: pd.DataFrame):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [format_prompt(p) for p in df["prompt"]],
                              "completion": [" " + str(o).strip() for o in df["output"]]})


def train_sft(model_path: str, data_path: str, checkpoints: str, out: str, s: common.TrainSettings,
              revision: str | None = None) -> dict:
    """SFT of the base model (a directory, or a hub id at ``revision``: base_model.revision, read from the
    snapshot that ``lara fetch`` put in the hub cache)."""
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from lara.hub import HubRef, commit_of, is_hub_id, snapshot

    base = model_path  # what the checkpoints' fingerprint names: the folder, or the hub id at its commit
    if is_hub_id(model_path):
        folder = snapshot(HubRef("base_model.name_or_path", model_path, "model", revision))
        base, model_path = f"{model_path}@{commit_of(folder)}", str(folder)
        log.info("base model %s: the fetched snapshot %s", base, folder)
    tokenizer, df = common.start(model_path, s, data_path)
    train_df, eval_df = common.split_eval(df, s.eval_fraction, s.seed)
    log.info("SFT on %d examples (%d held out for validation)", len(train_df), len(eval_df))
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=common.torch_dtype(s.dtype))
    args = common.training_arguments(SFTConfig, s, checkpoints, has_eval=len(eval_df) > 0,
                                     max_length=s.max_length, completion_only_loss=True, packing=False)
    trainer = common.quiet_trainer(SFTTrainer(model=model, args=args, train_dataset=sft_dataset(train_df),
                                              eval_dataset=sft_dataset(eval_df) if len(eval_df) else None,
                                              processing_class=tokenizer))
    metrics: dict = {"n_train": len(train_df), "n_eval": len(eval_df)}
    if len(eval_df):
        metrics["eval_loss_initial"] = trainer.evaluate()["eval_loss"]
        log.info("validation loss before training: %.4f", metrics["eval_loss_initial"])
        # evaluate() prepared the model for evaluation, which marks it prepared: train() would then skip the
        # DistributedDataParallel wrapper and each process would step on its own gradients
        trainer.model._is_accelerate_prepared = False
    metrics |= common.fit(trainer, checkpoints, s, {"base_model": base, "data": data_path})
    if len(eval_df):
        metrics["eval_loss_final"] = trainer.evaluate()["eval_loss"]
        log.info("validation loss after training: %.4f (was %.4f)", metrics["eval_loss_final"],
                 metrics["eval_loss_initial"])
    return common.save_trained(trainer, tokenizer, out, metrics, kind="sft", settings=s,
                               inputs={"base_model": model_path, "data": data_path})


def add_arguments(parser) -> None:
    common.add_common_arguments(parser, common.SFTSettings)
    parser.add_argument("--revision", default=None, help="hub revision of the base model (base_model.revision)")


def run(args) -> None:
    s = read_settings(args, common.SFTSettings)
    train_sft(args.model, args.data, args.checkpoints, args.out, s, revision=args.revision)
