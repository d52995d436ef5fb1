"""``lara train-reward``: the reward model (see ``lara.train.preference``)."""

from __future__ import annotations

from lara.train.common import RewardSettings
from lara.train.preference import command

HELP = "train the reward model on PKU-SafeRLHF-schema pairs (TRL RewardTrainer)"

add_arguments, run = command(RewardSettings, "reward")
