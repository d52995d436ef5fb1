"""``lara train-cost``: the cost model (see ``lara.train.preference``)."""

from __future__ import annotations

from lara.train.common import TrainSettings, add_common_arguments
from lara.train.preference import train_preference_model

HELP = "train the cost model on PKU-SafeRLHF-schema pairs (TRL RewardTrainer, Safe-RLHF sign terms)"


def add_arguments(parser) -> None:
    add_common_arguments(parser, model_help="initial model (the SFT model)")


def run(args) -> None:
    s = TrainSettings.from_json(args.settings, seed=args.seed, dtype=args.dtype)
    train_preference_model("cost", args.model, args.data, args.checkpoints, args.out, s)
