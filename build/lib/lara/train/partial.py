"""``lara train-partial``: PARGS partial reward or cost model on prefix pairs."""

from __future__ import annotations

from lara.train.common import PartialSettings, add_common_arguments, read_train_settings
from lara.train.preference import KINDS, train_preference_model

HELP = "train a PARGS partial reward or cost model on response prefixes with the full pair's label"


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS)
    add_common_arguments(parser, PartialSettings, model_help="initial model (the SFT model)")


def run(args) -> None:
    s = read_train_settings(args, PartialSettings)
    train_preference_model(args.kind, args.model, args.data, args.checkpoints, args.out, s, partial=True)
