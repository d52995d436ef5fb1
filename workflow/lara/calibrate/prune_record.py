"""``lara calibrate-prune``: lambda for the pruned Best-of-N decoder itself (``decode.bon_prune``), from the calibration
samples and their prefix scores (``lara score-prefixes``), written as a lambda record (``lambda_bon_prune.json``)
that the decoder's hat, star, crc, ltt and ltt_wsr settings read. The decoder is :class:`lara.calibrate.pruned.
PrunedBestOfN`; its record, every procedure and every floor are the calibration core's
(:mod:`lara.calibrate.procedures`), as for any decoder on a grid.
"""

from __future__ import annotations

import logging

from lara.calibrate.pruned import PruneSettings
from lara.settings import add_settings_arguments

log = logging.getLogger(__name__)

HELP = "calibrate lambda for the pruned Best-of-N decoder itself (decode.bon_prune) on the calibration samples"


def add_arguments(parser) -> None:
    parser.add_argument("--scores", required=True, help="the calibration samples with their prefix scores "
                                                        "(lara score-prefixes)")
    add_settings_arguments(parser, PruneSettings)
    parser.add_argument("--allow-infeasible", action="store_true",
                        help="write the record when the deployed procedure cannot reach tau (feasible: false)")
    parser.add_argument("--out", required=True, help="the record (lambda_bon_prune.json)")


def run(args) -> None:
    from lara.calibrate.grid import calibrate_command
    from lara.calibrate.pruned import decoder_from_table

    calibrate_command(args, PruneSettings, decoder_from_table, scorers=("prefix_reward_scorer", "prefix_cost_scorer"))
