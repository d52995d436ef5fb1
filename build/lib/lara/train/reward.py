"""``lara train-reward``: the reward model (see ``lara.train.preference``)."""

from __future__ import annotations

from lara.train.common import RewardSettings, add_common_arguments, read_train_settings
from lara.train.preference import train_preference_model

HELP = "train the reward model on PKU-SafeRLHF-schema pairs (TRL RewardTrainer)"


def add_arguments(parser) -> None:
    add_common_arguments(parser, RewardSettings, model_help="initial model (the SFT model)")


def run(args) -> None:
    s = read_train_settings(args, RewardSettings)
    train_preference_model("reward", args.model, args.data, args.checkpoints, args.out, s)
