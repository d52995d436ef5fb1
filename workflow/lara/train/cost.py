"""``lara train-cost``: the cost model (see ``lara.train.preference``)."""

from __future__ import annotations

from lara.train.common import CostSettings
from lara.train.preference import command

HELP = "train the cost model on PKU-SafeRLHF-schema pairs (TRL RewardTrainer, Safe-RLHF sign terms)"

add_arguments, run = command(CostSettings, "cost")
