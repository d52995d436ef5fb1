"""A decoder, as the calibration core sees it: one interface, one instance per decoder. Pure numpy, no I/O.

Everything the procedures (:mod:`lara.calibrate.procedures`: lambda-hat, the bootstrap's lambda*, CRC, LTT with
Hoeffding-Bentkus and betting p-values, the coverage study) need from a decoder is, per calibration prompt, its loss
as a function of lambda on a grid — the decoder's expected cost there, clipped to the certificates' bounds —, its
reward and tokens on the same axis, whether the mean loss is monotone, and its identity: the kind, N and K, the
schedule if it has one, every scorer it reads (partial ones too) and the record it is decoded from. A decoder is an
object with

* ``kind`` (the record's ``decoder.kind``), ``record`` (the record's file name in ``calibration/``),
* ``identity()``: the record's ``decoder`` object (kind, n, k, and what else fixes the decoder),
* ``describe()``: the decoder in words, for statements,
* ``curves(grid, bounds)``: a :class:`Curves` over the calibration prompts,
* ``full_tokens()``: the tokens full Best-of-N spends on the same draws (the reference of its token ratio).

Full Best-of-N keeps its exact-breakpoint kernel (:mod:`lara.calibrate.bestofn`, lambda continuous); the decoders
here are searched on a grid, where a non-monotone decoder (pruned Best-of-N) is still searched correctly (the
stable root). A new decoder is one more instance (:mod:`lara.calibrate.best_of_k` is one in a page) and one
line in :data:`lara.steps.CORE_DECODERS`; the procedures, the record, its statements, floors and identity checks are
the core's, written once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

# the loss of a grid decoder is an average over subsets of a prompt's K samples: the floor of subsets a sampled
# (not exact) estimate needs to state its standard error (one subset has none)
MIN_SAMPLED_SUBSETS = 2
MIN_PROMPTS = 2  # a bootstrap over prompts of one prompt resamples nothing: no lambda* is stated


@dataclass(frozen=True)
class Curves:
    """Per prompt and grid lambda (P, L): a decoder's expected cost, the cost clipped to the certificates' bounds,
    reward and tokens; the per-prompt standard error of the clipped cost (zero where exact); the subsets averaged
    and whether they are all of them."""

    grid: np.ndarray
    cost: np.ndarray
    clipped: np.ndarray
    reward: np.ndarray
    tokens: np.ndarray
    cost_se: np.ndarray
    n_subsets: int
    exact: bool

    @property
    def n_prompts(self) -> int:
        return int(self.cost.shape[0])

    @property
    def monotone(self) -> bool:
        """The calibration mean cost never rises with lambda."""
        return bool((np.diff(self.cost.mean(axis=0)) <= 1e-12).all())

    PER_PROMPT = ("cost", "clipped", "reward", "tokens", "cost_se")  # the (P, L) fields

    def take(self, rows) -> Curves:
        """The curves of the prompts ``rows`` (with repeats: a draw of prompts)."""
        return replace(self, **{f: getattr(self, f)[rows] for f in self.PER_PROMPT})

    @classmethod
    def stack(cls, parts: list[Curves]) -> Curves:
        """The curves of several prompt sets on one grid, one after the other (a coverage population)."""
        cat = {f: np.concatenate([getattr(c, f) for c in parts]) for f in cls.PER_PROMPT}
        return cls(parts[0].grid, **cat, n_subsets=min(c.n_subsets for c in parts), exact=all(c.exact for c in parts))

    def at(self, i: int) -> dict:
        """The decoder's calibration-set means at grid point ``i``."""
        return {"mean_cost": float(self.cost[:, i].mean()), "mean_reward": float(self.reward[:, i].mean()),
                "mean_tokens": float(self.tokens[:, i].mean())}


class Decoder(Protocol):
    """What a decoder contributes to calibration (the module docstring)."""

    kind: str
    record: str

    def identity(self) -> dict: ...

    def describe(self) -> str: ...

    def curves(self, grid, bounds) -> Curves: ...

    def full_tokens(self) -> float: ...

    def facts(self, lam: float) -> dict: ...  # what its record states beyond the curves, at the deployed lambda


def clip(cost: np.ndarray, bounds) -> np.ndarray:
    """The cost the certificates are about: clipped to ``bounds`` (none: the cost itself)."""
    return cost if bounds is None else np.clip(cost, float(bounds[0]), float(bounds[1]))


def clipped_share(cost: np.ndarray, bounds) -> dict | None:
    """The shares of calibration costs below and above ``bounds`` (None without bounds)."""
    if bounds is None:
        return None
    return {"below": float((cost < bounds[0]).mean()), "above": float((cost > bounds[1]).mean())}


def subset_statement(c: Curves, n: int) -> str:
    """How a prompt's loss averages the decoder over N-subsets of its K samples, in words."""
    if c.exact:
        return f"exact over every {n}-subset of each prompt's samples"
    return f"over {c.n_subsets} random {n}-subsets per prompt (an unbiased estimate; its standard error recorded)"
