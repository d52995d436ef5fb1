"""The one bootstrap over test prompts and the one verdict against tau, shared by the Best-of-N
sweep (``lara bon-sweep``), the summary and constraint audit (``lara aggregate``) and the figures.

A percentile interval of a mean over prompts: each replicate reweights the prompts by their
multiplicities in a resample with replacement (the calibration's own resampler,
:func:`lara.calibrate.dual.resample_weights`), so the means of every column come from one matrix
product. The verdict compares the interval with tau: met when its upper end is at or below tau,
met on average when only the mean is, violated otherwise.
"""

from __future__ import annotations

import numpy as np

BOUNDS = (0.025, 0.975)  # the 95 % percentile interval's quantiles (written out: 1 - 0.95 is not 0.05 in floats)
VERDICTS = ("met (upper 95% bound at or below tau)", "met on average, not with 95% confidence", "violated")


def bootstrap_means(per_prompt: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, L) means over prompt resamples of per-prompt values (P, L)."""
    from lara.calibrate.dual import resample_weights

    return resample_weights(np.random.default_rng(seed), per_prompt.shape[0], n_boot) @ per_prompt


def interval(per_prompt: np.ndarray, n_boot: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lower, upper) of each column of per-prompt values (P, L): the 95 % percentile interval."""
    lo, hi = np.quantile(bootstrap_means(per_prompt, n_boot, seed), BOUNDS, axis=0)
    return per_prompt.mean(axis=0), lo, hi


def mean_interval(values, n_boot: int, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lower, upper) of one per-prompt column; non-finite values (an unrated reply) are left out,
    and a column without a finite value is (nan, nan, nan)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return float("nan"), float("nan"), float("nan")
    mean, lo, hi = interval(x[:, None], n_boot, seed)
    return float(mean[0]), float(lo[0]), float(hi[0])


def verdict(mean: float, hi: float, tau: float) -> str:
    """The verdict of an interval (its mean and upper end) against the budget tau."""
    return VERDICTS[0] if hi <= tau else VERDICTS[1] if mean <= tau else VERDICTS[2]
