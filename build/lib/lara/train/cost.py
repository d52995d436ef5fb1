"""``lara train-cost``: the cost model (see ``lara.train.preference``)."""

from __future__ import annotations

from lara.train.common import CostSettings, add_common_arguments, read_train_settings
from lara.train.preference import train_preference_model

HELP = "train the cost model on PKU-SafeRLHF-schema pairs (TRL RewardTrainer, Safe-RLHF sign terms)"


def add_arguments(parser) -> None:
    add_common_arguments(parser, CostSettings, model_help="initial model (the SFT model)")


def run(args) -> None:
    s = read_train_settings(args, CostSettings)
    train_preference_model("cost", args.model, args.data, args.checkpoints, args.out, s)
