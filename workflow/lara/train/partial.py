"""``lara train-partial``: PARGS partial reward or cost model on prefix pairs."""

from __future__ import annotations

from lara.train.common import PartialSettings
from lara.train.preference import command

HELP = "train a PARGS partial reward or cost model on response prefixes with the full pair's label"

add_arguments, run = command(PartialSettings)
