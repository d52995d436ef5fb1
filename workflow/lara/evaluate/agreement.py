"""How far two scorers agree on the same items: the scorer a decoder was held to and a judge it never saw.

Two measures, each with a bootstrap-over-items 95 % percentile interval (every replicate resamples the items with
replacement and recomputes the measure on the resample; the two measures share the resamples):

* **Spearman's rank correlation** (:func:`scipy.stats.spearmanr`; tied values get their average rank): do the two
  order the items alike, over the whole range?
* **top-decile agreement**: of the scorer's top 10 %, the share that is also in the judge's top 10 %. A top
  10 % is every item at or above the k-th largest score, k = max(1, n // 10): exactly k items where no tie straddles
  that score, more where one does (tied items are all in or all out, so identical scores agree fully, ties or not).
  Under independent scores it is about k / n; identical orders give 1, reversed orders 0 (for n ≥ 2k).

A replicate on which either side is constant has no rank correlation: it is left out of the Spearman interval
and counted (``degenerate``); too few defined replicates left is refused. Pure numpy / scipy.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

MIN_ITEMS = 10  # fewer: a decile is not an item, and a rank correlation of a handful of items says little
_CELLS = 1 << 22  # resampled values held at once (replicates are drawn in blocks of _CELLS // n)


@dataclass(frozen=True)
class Agreement:
    n: int  # items
    spearman: float
    spearman_ci: tuple[float, float]  # 95 % percentile interval over item resamples
    top_decile: float  # share of the scorer's top decile also in the judge's top decile
    top_decile_ci: tuple[float, float]
    top_k: int  # k = max(1, n // 10): a top decile is every item at or above the k-th largest score
    n_boot: int
    seed: int
    degenerate: int  # replicates with a constant side (no rank correlation; left out of spearman_ci)

    def to_dict(self) -> dict:
        return {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(self).items()}


def top_k(n: int) -> int:
    """The size of a top decile of ``n`` items: n // 10, at least 1."""
    return max(1, n // 10)


def top_set(values: np.ndarray, k: int) -> np.ndarray:
    """Per item (along the last axis), whether it is at or above the ``k``-th largest value."""
    values = np.asarray(values, dtype=np.float64)
    n = values.shape[-1]
    return values >= np.partition(values, n - k, axis=-1)[..., n - k:n - k + 1]


def top_agreement(scorer: np.ndarray, judge: np.ndarray, k: int) -> np.ndarray:
    """Share of the scorer's top set (:func:`top_set`) that is in the judge's (along the last axis)."""
    top = top_set(scorer, k)
    return (top & top_set(judge, k)).sum(-1) / top.sum(-1)


def rank_correlation(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's rho along the last axis (average ranks for ties); nan where a row of either is constant."""
    from scipy.stats import rankdata

    rx, ry = rankdata(x, axis=-1), rankdata(y, axis=-1)
    rx = rx - rx.mean(-1, keepdims=True)
    ry = ry - ry.mean(-1, keepdims=True)
    sx, sy = np.sqrt((rx * rx).sum(-1)), np.sqrt((ry * ry).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = (rx * ry).sum(-1) / (sx * sy)
    return np.where((sx > 0) & (sy > 0), np.clip(rho, -1.0, 1.0), np.nan)


def replicate_indices(n: int, n_boot: int, seed: int):
    """The bootstrap's item resamples, in blocks: (rows, n) arrays of indices, ``n_boot`` rows in all."""
    rng = np.random.default_rng(seed)
    block = max(1, _CELLS // n)
    for lo in range(0, n_boot, block):
        yield rng.integers(0, n, size=(min(block, n_boot - lo), n))


def agreement_problem(scorer_scores, judge_scores) -> str | None:
    """What makes two score vectors unfit for :func:`agreement`, or None."""
    x, y = np.asarray(scorer_scores), np.asarray(judge_scores)
    for name, v in (("scorer", x), ("judge", y)):
        if v.ndim != 1:
            return f"the {name}'s scores are not one score per item (shape {v.shape})"
        if not np.issubdtype(v.dtype, np.number) or np.issubdtype(v.dtype, np.complexfloating):
            return f"the {name}'s scores are not real numbers (dtype {v.dtype})"
    if len(x) != len(y):
        return f"{len(x)} scorer scores but {len(y)} judge scores (one each per item)"
    if len(x) < MIN_ITEMS:
        return f"{len(x)} items; agreement needs at least {MIN_ITEMS}"
    for name, v in (("scorer", x), ("judge", y)):
        bad = ~np.isfinite(v)
        if bad.any():
            return f"the {name}'s scores hold {int(bad.sum())} non-finite values (first at item {int(np.argmax(bad))})"
        if np.all(v == v[0]):
            return f"the {name}'s scores are constant ({v[0]!r}): the rank correlation is undefined"
    return None


def agreement(scorer_scores, judge_scores, n_boot: int = 2000, seed: int = 0) -> Agreement:
    """Spearman's rho and top-decile agreement of two scorers' scores of the same items, each with a 95 %
    percentile interval over ``n_boot`` item resamples (``seed``). ValueError on unfit input: non-finite values,
    different lengths, fewer than MIN_ITEMS items, a constant side, or too few replicates for a 95 % interval."""
    from scipy.stats import spearmanr

    from lara.stats import BOUNDS, replicates_problem

    problem = agreement_problem(scorer_scores, judge_scores) or replicates_problem(int(n_boot), "n_boot")
    if problem:
        raise ValueError(problem)
    x = np.asarray(scorer_scores, dtype=np.float64)
    y = np.asarray(judge_scores, dtype=np.float64)
    n, k = len(x), top_k(len(x))
    rho = float(spearmanr(x, y).statistic)
    top = float(top_agreement(x, y, k))
    rhos, tops = [], []
    for idx in replicate_indices(n, int(n_boot), int(seed)):
        xb, yb = x[idx], y[idx]
        rhos.append(rank_correlation(xb, yb))
        tops.append(top_agreement(xb, yb, k))
    rhos, tops = np.concatenate(rhos), np.concatenate(tops)
    defined = rhos[np.isfinite(rhos)]
    degenerate = int(len(rhos) - len(defined))
    short = replicates_problem(len(defined), "n_boot")
    if short:
        raise ValueError(f"{degenerate} of {n_boot} resamples have a constant side (no rank correlation): {short}")
    lo, hi = np.quantile(defined, BOUNDS)
    tlo, thi = np.quantile(tops, BOUNDS)
    return Agreement(n=n, spearman=rho, spearman_ci=(float(lo), float(hi)), top_decile=top,
                     top_decile_ci=(float(tlo), float(thi)), top_k=k, n_boot=int(n_boot), seed=int(seed),
                     degenerate=degenerate)
