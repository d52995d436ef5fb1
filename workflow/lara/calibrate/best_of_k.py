"""Best-of-k for k < N: the smaller Best-of-N a token budget compares pruned Best-of-N with, as one more instance of
the calibration core's decoder interface (:mod:`lara.calibrate.decoder`). Pure numpy.

On a prompt's K calibration samples, Best-of-k's expected cost, reward and tokens at lam are exact over every
k-subset (the rank weights of :mod:`lara.calibrate.bestofn`, ties as the decoder breaks them); it generates k whole
responses, so its tokens are k times the mean length whatever lam. Its lambda, every procedure, the record and its
checks are the core's (:mod:`lara.calibrate.procedures`); nothing else is written for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from lara.calibrate.decoder import Curves, clip


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
