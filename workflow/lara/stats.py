"""The one bootstrap over test prompts and the one verdict against tau, shared by the Best-of-N
sweep (``lara bon-sweep``), the summary and constraint audit (``lara aggregate``) and the figures.

A percentile interval of a mean over prompts: each replicate reweights the prompts by their
multiplicities in a resample with replacement (the calibration's own resampler,
:func:`resample_weights`, the calibration bootstrap's too), so the means of every column come from one matrix
product. The same replicates give the two-sided 95 % interval (drawn as bands, written ``ci95``)
and the one-sided 95 % bounds that the verdict reads:

* **met**: the one-sided 95 % upper bound of the mean cost is at or below tau;
* **violated**: the one-sided 95 % lower bound is above tau;
* **inconclusive**: tau lies between them: the test prompts cannot tell at 95 %.

Each direction is a one-sided test at level 5 %, so a verdict is wrong with probability at most
about 5 % (the bootstrap being approximate), and a mean above tau is not called "violated" unless
the data say so. Paired differences (the same prompts under two settings) are bootstrapped on the
per-prompt differences, which is much tighter than comparing two unpaired intervals.
"""

from __future__ import annotations

import numpy as np

BOUNDS = (0.025, 0.975)  # the 95 % percentile interval's quantiles (written out: 1 - 0.95 is not 0.05 in floats)
ONE_SIDED = (0.05, 0.95)  # the one-sided 95 % lower and upper bounds
VERDICTS = ("met (one-sided 95% upper bound at or below tau)",
            "inconclusive (tau within the one-sided 95% bounds)",
            "violated (one-sided 95% lower bound above tau)")
# the fewest distinct prompts a verdict is given on: below it a percentile bootstrap of a mean undercovers
# (with one prompt its interval has width zero), so the verdict says so instead of met or violated
MIN_PROMPTS = 20
TOO_FEW = f"too few prompts (fewer than {MIN_PROMPTS} distinct prompts: no verdict)"
# the fewest bootstrap replicates beyond each bound of a 95 % interval (a quantile read off fewer is noise):
# an interval's bootstrap needs MIN_TAIL / 0.025 = 200 replicates, a deployed quantile q MIN_TAIL / (1 - q)
MIN_TAIL = 5


def min_replicates(tail: float) -> int:
    """The fewest bootstrap replicates that put MIN_TAIL of them beyond a quantile with ``tail`` mass beyond it."""
    import math

    return math.ceil(MIN_TAIL / tail - 1e-9)


def resample_weights(rng: np.random.Generator, n: int, b: int) -> np.ndarray:
    """(b, n) prompt weights n_bi / N of b bootstrap resamples of n prompts."""
    idx = rng.integers(0, n, size=(b, n), dtype=np.int32)
    w = np.empty((b, n))
    for i in range(b):  # row by row: the counts stay in cache (3x faster than one flat bincount)
        w[i] = np.bincount(idx[i], minlength=n)
    w *= 1.0 / n
    return w


def bootstrap_means(per_prompt: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, L) means over prompt resamples of per-prompt values (P, L)."""
    return resample_weights(np.random.default_rng(seed), per_prompt.shape[0], n_boot) @ per_prompt


def interval(per_prompt: np.ndarray, n_boot: int, seed: int) -> tuple[np.ndarray, ...]:
    """(mean, lower, upper, one-sided lower, one-sided upper) of each column of per-prompt values
    (P, L): the two-sided 95 % percentile interval and the one-sided 95 % bounds, from one set of
    replicates."""
    q = np.quantile(bootstrap_means(per_prompt, n_boot, seed), [*BOUNDS, *ONE_SIDED], axis=0)
    return (per_prompt.mean(axis=0), *q)


def mean_interval(values, n_boot: int, seed: int = 0) -> tuple[float, float, float]:
    """(mean, lower, upper) of one per-prompt column; non-finite values (an unrated reply) are left out,
    and a column without a finite value is (nan, nan, nan)."""
    return mean_bounds(values, n_boot, seed)[:3]


def mean_bounds(values, n_boot: int, seed: int = 0) -> tuple[float, float, float, float, float]:
    """(mean, 95 % lower, 95 % upper, one-sided lower, one-sided upper) of one per-prompt column,
    non-finite values left out (all nan when none is finite)."""
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if len(x) == 0:
        return (float("nan"),) * 5
    return tuple(float(v[0]) for v in interval(x[:, None], n_boot, seed))


def quantile_replicates_problem(n_boot: int, quantile: float, key: str, what: str) -> str | None:
    """The problem of a bootstrap of ``n_boot`` replicates that puts fewer than MIN_TAIL beyond the ``quantile``
    it deploys (``what`` says which quantile, for the message), or None."""
    return replicates_problem(n_boot, key, 1 - quantile, f"{what} {quantile:g} quantile", "")


def replicates_problem(n_boot: int, key: str = "evaluation.bootstrap", tail: float = BOUNDS[0],
                       beyond: str = "each bound of a 95% interval", end: str = " (nothing was computed)"):
    """The problem of an interval's bootstrap that puts fewer than MIN_TAIL replicates beyond a 95 % bound (a
    bound read off fewer is noise; ``tail``: the mass beyond another quantile, said as ``beyond``), or None."""
    floor = min_replicates(tail)
    if n_boot < floor:
        return f"{key}: {n_boot} replicates put fewer than {MIN_TAIL} beyond {beyond}; use at least {floor}{end}"
    return None


def check_replicates(n_boot: int, key: str = "evaluation.bootstrap") -> None:
    """:func:`replicates_problem`, refused before computing."""
    from lara.config import ConfigError

    problem = replicates_problem(n_boot, key)
    if problem:
        raise ConfigError(problem)


def verdict(lower: float, upper: float, tau: float, n: int | None = None) -> str:
    """The verdict against the budget tau from the one-sided 95 % bounds of the mean cost over ``n`` distinct
    prompts (below MIN_PROMPTS: no verdict)."""
    if n is not None and n < MIN_PROMPTS:
        return TOO_FEW
    return VERDICTS[0] if upper <= tau else VERDICTS[2] if lower > tau else VERDICTS[1]


def verdict_problems(doc, tau: float | None = None, n: int | None = None, where: str = "") -> list[str]:
    """Every verdict in ``doc`` (an audit, at any depth) that its own one-sided 95 % bounds, tau and prompt count do
    not give: a verdict is read only with its check, so an edited one is found wherever it stands."""
    out = []
    if isinstance(doc, dict):
        tau = doc.get("tau", tau) if isinstance(doc.get("tau", tau), (int, float)) else tau
        n = next((doc[k] for k in ("n_prompts", "n_test_prompts") if isinstance(doc.get(k), int)), n)
        bounds = doc.get("one_sided95")
        stated = isinstance(doc.get("verdict"), str) and isinstance(bounds, list) and len(bounds) == 2
        if stated and tau is not None and doc["verdict"] != verdict(bounds[0], bounds[1], tau, n):
            out.append(f"{where or 'the audit'}: verdict {doc['verdict']!r}, but its own bounds {bounds} and tau "
                       f"{tau:g} give {verdict(bounds[0], bounds[1], tau, n)!r}")
        for k, v in doc.items():
            out += verdict_problems(v, tau, n, f"{where}.{k}" if where else k)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += verdict_problems(v, tau, n, f"{where}[{i}]")
    return out


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) two-sided ``level`` interval of a binomial rate from k successes in n trials."""
    from scipy.stats import beta

    a = (1 - level) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def rate_audit(losses, tau: float, reward=None, n_boot: int = 0, seed: int = 0) -> dict:
    """The held-out audit of a probability constraint: per-prompt losses in {0, 1}, their rate against tau with the
    exact Clopper-Pearson two-sided 95 % interval and one-sided 95 % bounds (the two-sided 90 % interval's ends),
    and the verdict from those bounds; with ``reward``, its mean and bootstrap interval too."""
    x = np.asarray(losses, dtype=float)
    if not np.all((x == 0) | (x == 1)):
        raise ValueError("a probability constraint's losses are 0 or 1")
    n, k = len(x), int(x.sum())
    lo, hi = clopper_pearson(k, n, 0.95)
    lower, upper = clopper_pearson(k, n, 0.90)
    row = {"n_prompts": n, "mean_cost": k / n, "ci95": [lo, hi], "one_sided95": [lower, upper],
           "verdict": verdict(lower, upper, tau, n), "interval": "clopper_pearson", "count": k}
    return _with_reward(row, reward, n_boot, seed)


def cost_audit(cost, tau: float, n_boot: int, seed: int, reward=None) -> dict:
    """The held-out audit of one decoder's per-prompt costs (tau's units) against tau: mean, two-sided
    95 % interval, one-sided bounds and verdict; with ``reward``, its mean and interval too."""
    mean, lo, hi, lower, upper = mean_bounds(cost, n_boot, seed)
    n = int(np.isfinite(np.asarray(cost, dtype=float)).sum())
    row = {"n_prompts": n, "mean_cost": mean, "ci95": [lo, hi], "one_sided95": [lower, upper],
           "verdict": verdict(lower, upper, tau, n)}
    return _with_reward(row, reward, n_boot, seed)


def _with_reward(row: dict, reward, n_boot: int, seed: int) -> dict:
    """An audit row with, given per-prompt ``reward``, its mean and bootstrap interval."""
    if reward is not None:
        r, r_lo, r_hi = mean_interval(reward, n_boot, seed)
        row |= {"mean_reward": r, "reward_ci95": [r_lo, r_hi]}
    return row


def paired_difference(a, b, n_boot: int, seed: int) -> dict:
    """Mean of a - b over the same prompts (two aligned per-prompt arrays) with its 95 % interval."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean, lo, hi = mean_interval(d, n_boot, seed)
    return {"mean": mean, "ci95": [lo, hi], "n_prompts": int(np.isfinite(d).sum())}
