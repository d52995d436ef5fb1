"""Best-of-k for k < N: the smaller Best-of-N a token budget compares pruned Best-of-N with, as one more instance of
the calibration core's decoder interface (:mod:`lara.calibrate.decoder`). Pure numpy.

On a prompt's K calibration samples, Best-of-k's expected cost, reward and tokens at lam are exact over every
k-subset (the rank weights of :mod:`lara.calibrate.bestofn`, ties as the decoder breaks them); it generates k whole
responses, so its tokens are k times the mean length whatever lam. Its lambda, every procedure, the record and its
checks are the core's (:mod:`lara.calibrate.procedures`); nothing else is written for it.

``lara calibrate-best-of-k --k K`` writes its record (``lambda_bon_k{K}.json``) from the calibration samples with their
lengths; ``lara bon-sweep --k-lambda-json`` audits its lambdas on the test prompts (Fig. 1's Best-of-K curve). Full
Best-of-K's exact calibration (``lara calibrate`` at decode.bon_n = K) searches the same monotone curve without a
grid, so the core's lambda-hat, CRC and LTT lambdas are the exact ones rounded up to the grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from lara.calibrate.decoder import Curves, clip
from lara.calibrate.procedures import GridCalibration
from lara.settings import Settings, add_settings_arguments, seed_setting, setting

HELP = "calibrate lambda for Best-of-k (k <= decode.bon_n) through the calibration core, with its tokens"


@dataclass(frozen=True)
class BestOfK:
    """Best-of-``k`` on calibration samples (P, K) with their lengths; ``n``: full Best-of-N's size (its token
    reference)."""

    reward: np.ndarray | None
    cost: np.ndarray | None
    length: np.ndarray | None
    k: int
    n: int
    kind: ClassVar[str] = "best_of_k"
    mode: ClassVar[str] = "bon_k"

    @property
    def record(self) -> str:
        return f"lambda_bon_k{self.k}.json"

    @classmethod
    def from_settings(cls, st: dict, *arrays) -> BestOfK:
        return cls(*(arrays or (None, None, None)), int(st["k"]), int(st["n"]))

    def identity(self) -> dict:
        samples = {} if self.reward is None else {"k": int(self.reward.shape[1])}
        return {"kind": self.kind, "n": self.k, **samples, "of_n": self.n}

    def describe(self) -> str:
        return f"Best-of-{self.k} (of Best-of-{self.n}'s budget)"

    def curves(self, grid, bounds) -> Curves:
        from lara.calibrate.bestofn import expected

        mask = np.ones(self.reward.shape, dtype=bool)
        cost, clipped, reward = expected(self.reward, self.cost, mask, grid, self.k, self.cost,
                                         clip(self.cost, bounds), self.reward)
        tokens = np.broadcast_to(self.k * self.length.mean(axis=1, keepdims=True), cost.shape).copy()
        return Curves(np.asarray(grid, dtype=float), cost, clipped, reward, tokens, np.zeros_like(cost), 1, True)

    def full_tokens(self) -> float:
        return float(self.length.mean(axis=1).mean() * self.n)

    def facts(self, lam: float) -> dict:
        return {}  # nothing beyond its curves


@dataclass(frozen=True)
class BestOfKSettings(GridCalibration, Settings):
    """Best-of-k's calibration on the lambda grid: the calibration section's keys, the grid of every grid decoder,
    and k (each rule's own: one record per k)."""

    k: int = setting(help="Best-of-k's k, at most decode.bon_n (full Best-of-N unless the rule sets its own k).",
                     minimum=1, key="decode.bon_n")
    n: int = setting(help="Full Best-of-N's N (its tokens are the reference).", minimum=1, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response in tokens.", minimum=1, key="generation.max_new_tokens")
    grid_points: int = setting(help="Lambdas of the grid on [0, calibration.lambda_search_max].", minimum=2,
                               key="decode.bon_prune.grid_points")
    seed: int = seed_setting()

    @staticmethod
    def jobs(config: dict) -> list[dict]:
        """The k of each job the rules give it: one record per Fig. 1 size and at decode.bon_n (bon mode only)."""
        dec = config["decode"]
        if "bon" not in dec["methods"] or config["calibration"]["mode"] != "bon":
            return []
        return [{"k": k} for k in sorted(set(dec["sweep_n"]) | {dec["bon_n"]})]


def from_table(path, s: BestOfKSettings, where: str):
    """Best-of-k of settings ``s`` on scored samples with their lengths: (decoder, prompt ids, costs (P, K), table)."""
    from lara.read.candidates import read_prefix_scores
    from lara.settings import ConfigError

    ids, (reward, cost, length, _, _), _, df = read_prefix_scores(path, (), where, s.max_new_tokens)
    if not s.k <= s.n <= reward.shape[1]:  # full Best-of-N (the one it is compared with) is built from the K samples
        raise ConfigError(f"--settings: k = {s.k}, decode.bon_n = {s.n}; Best-of-k needs k <= N <= K, {where} {path}'s "
                          f"samples per prompt ({reward.shape[1]})")
    return BestOfK(reward, cost, length, s.k, s.n), ids, cost, df


def add_arguments(parser) -> None:
    parser.add_argument("--scores", required=True, help="the calibration samples, scored, with n_tokens (lara score)")
    add_settings_arguments(parser, BestOfKSettings)
    parser.add_argument("--allow-infeasible", action="store_true",
                        help="write the record when the deployed procedure cannot reach tau (feasible: false)")
    parser.add_argument("--out", required=True, help="the record (lambda_bon_k{k}.json)")


def run(args) -> None:
    from lara.calibrate.grid import calibrate_command

    calibrate_command(args, BestOfKSettings, from_table)
