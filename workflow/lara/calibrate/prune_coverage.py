"""``lara coverage-prune``: the coverage study of pruned Best-of-N's own calibration (``decode.bon_prune``).

The population is every prompt of the given prefix-score tables (the calibration samples and the test prompts'
candidates): for each, the decoder's expected cost, clipped cost, reward and tokens at every lambda of the grid,
computed once. Each repeat draws n prompts i.i.d. from the population, calibrates on them with every procedure
(bootstrap lambda*, CRC, LTT with Hoeffding-Bentkus and with betting p-values) and reads the chosen lambda's population
mean off the population curves: a violation is a population mean clipped cost above tau. LTT promises a violation rate
<= delta; CRC a mean clipped cost <= tau (over draws); the bootstrap promises nothing. The study is the calibration
core's for every grid decoder (:func:`lara.calibrate.procedures.study`); this module binds the pruned decoder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from lara.calibrate.procedures import CoverageCalibration
from lara.calibrate.pruned import ScheduleKeys
from lara.settings import Settings, add_settings_arguments, seed_setting, setting

HELP = "coverage study of pruned Best-of-N's own calibration (bootstrap, CRC, LTT) on the scored prefix population"
OUTPUTS = ("out", "table")


@dataclass(frozen=True)
class PruneCoverageSettings(ScheduleKeys, CoverageCalibration, Settings):
    """What the pruned decoder's coverage study reads (coverage, calibration and decode.bon_prune keys)."""

    grid_points: int = setting(help="The lambda grid.", minimum=2, key="decode.bon_prune.grid_points")
    max_subsets: int = setting(help="N-subsets per prompt.", minimum=1, key="decode.bon_prune.max_subsets")
    repeats: int = setting(200, "Calibration draws per size.", minimum=1, key="coverage.repeats")
    n_prompts: list[int] = setting([50, 100, 200], "Calibration sizes n.", minimum=1, key="coverage.n_prompts")
    bootstrap: int = setting(1000, "Bootstrap replicates inside each draw.", minimum=1, key="coverage.bootstrap")
    seed: int = seed_setting()
    ties: Literal["index", "keep"] = setting("index", "A tie at a keep cut.", key="decode.bon_prune.ties")


def add_arguments(parser) -> None:
    parser.add_argument("--scores", nargs="+", required=True,
                        help="prefix-score tables (lara score-prefixes): together the population")
    add_settings_arguments(parser, PruneCoverageSettings)
    parser.add_argument("--out", required=True, help="coverage_bon_prune.json")
    parser.add_argument("--table", required=True, help="coverage_bon_prune.csv: one row per procedure and size")


def run(args) -> None:
    from lara.calibrate.grid import coverage_command
    from lara.calibrate.pruned import decoder_from_table

    coverage_command(args, PruneCoverageSettings, decoder_from_table, "coverage_bon_prune")
