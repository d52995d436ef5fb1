"""A variance-adaptive Learn-then-Test test: betting (Waudby-Smith & Ramdas, *Estimating means of bounded random
variables by betting*, JRSS-B 2024). Pure numpy, no I/O. The ``ltt_wsr`` procedure of :mod:`lara.calibrate.certify`
and of the vector calibration, beside ``ltt``'s Hoeffding-Bentkus p-values.

The null of LTT at a lambda is "the expected loss is above tau". With the losses rescaled to [0, 1] (the cost
bounds [lo, hi]) and a = (tau - lo) / (hi - lo), a gambler who bets that the mean is below a multiplies her wealth
by 1 + b_t (a - x_t) at each loss x_t, with a bet b_t in [0, 1 / (1 - a)) chosen from the losses before t only.
Under the null E[a - x_t] <= 0, so her wealth is a nonnegative supermartingale from 1 and, by Ville's inequality,
P(sup_t wealth_t >= 1 / delta) <= delta: rejecting when her wealth ever reaches 1 / delta is a level-delta test,
whatever the bets. The bets here are WSR's predictable plug-in: b_t = min(sqrt(2 log(1 / delta) / (n s2_{t-1})),
c / (1 - a)), s2 a running variance estimate (prior 1/4 with weight one), c = 1/2: small losses with little spread
make the wealth grow fast, which is where Hoeffding's bound (a worst-case variance of 1/4) gives most away.

The calibration prompts are exchangeable, so one fixed (seeded) order of them is a valid sequence; every lambda is
tested in that order. Learn then Test tests the lambdas from the search interval's end downwards and stops at the
first one it cannot reject (fixed-sequence testing controls the error at delta without a monotone p-value): the
certified lambda is the smallest of the rejected run.
"""

from __future__ import annotations

import math

import numpy as np

BET_TRUNCATION = 0.5  # c: a bet never risks more than half of the wealth on one loss


def wealth_path(x: np.ndarray, a: float, delta: float) -> np.ndarray:
    """The gambler's wealth after each loss of ``x`` (in [0, 1], in testing order) against "mean > a", with WSR's
    predictable plug-in bets for level ``delta`` (module docstring). Broadcasts over leading axes of ``x``."""
    x = np.asarray(x, dtype=float)
    n = x.shape[-1]
    t = np.arange(1, n + 1, dtype=float)
    mean = (0.5 + np.cumsum(x, axis=-1)) / (t + 1)  # mu-hat_t, a prior of 1/2 with weight one
    prev_mean = np.concatenate([np.full(x.shape[:-1] + (1,), 0.5), mean[..., :-1]], axis=-1)
    var = (0.25 + np.cumsum((x - prev_mean) ** 2, axis=-1)) / (t + 1)  # sigma2-hat_t
    prev_var = np.concatenate([np.full(x.shape[:-1] + (1,), 0.25), var[..., :-1]], axis=-1)
    cap = BET_TRUNCATION / (1.0 - a) if a < 1 else np.inf
    bet = np.minimum(np.sqrt(2.0 * math.log(1.0 / delta) / (n * prev_var)), cap)
    return np.cumprod(1.0 + bet * (a - x), axis=-1)


def betting_p_values(losses: np.ndarray, tau: float, delta: float, bounds, order: np.ndarray) -> np.ndarray:
    """The p-value of "expected loss > tau" for each row of ``losses`` (..., n): min(1, 1 / the gambler's largest
    wealth), the losses in ``bounds`` taken in the order ``order`` (indices into the last axis: a permutation of the
    n prompts, or any sequence of them drawn independently of the losses). Valid at every level (Ville's
    inequality); the bets are tuned for level ``delta``. Where the losses' own mean is above tau the p-value is 1:
    a wealth that ran up early on a few small losses never certifies a lambda whose calibration mean misses tau
    (a test that rejects less often than a valid one is valid)."""
    lo, hi = (float(b) for b in bounds)
    a = (tau - lo) / (hi - lo)
    losses = np.asarray(losses, dtype=float)
    if a <= 0:
        return np.ones(losses.shape[:-1])
    if a >= 1:
        return np.zeros(losses.shape[:-1])
    x = np.clip((losses[..., order] - lo) / (hi - lo), 0.0, 1.0)
    p = np.minimum(1.0, 1.0 / wealth_path(x, a, delta).max(axis=-1))
    # a mean above tau is never certified, however the wealth ran: p = 1 there (rejecting less often keeps the level)
    return np.where(x.mean(axis=-1) <= a + 1e-12, p, 1.0)


def betting_rejects(losses: np.ndarray, tau: float, delta: float, bounds, order: np.ndarray) -> np.ndarray:
    """Whether the level-``delta`` betting test rejects "expected loss > tau" for each row of ``losses`` (..., n),
    the losses in ``bounds`` taken in the order ``order`` (a permutation of the n prompts)."""
    return betting_p_values(losses, tau, delta, bounds, order) <= delta


def prompt_order(n: int, seed: int) -> np.ndarray:
    """The one fixed order in which the calibration prompts enter every test (seeded, so a record is rebuilt)."""
    return np.random.default_rng([seed, 48]).permutation(n)


def betting_ltt_lambda(st, tau: float, delta: float, lam_max: float, bounds, seed: int,
                       block: int = 256, rows: np.ndarray | None = None) -> tuple[float, bool]:
    """The Learn-then-Test lambda with betting tests from the steps ``st`` of the prompts' clipped expected costs
    (:func:`lara.calibrate.bestofn.steps`, values in ``bounds``): the lambdas from ``lam_max`` down, one test per
    stretch of constant losses, stopped at the first stretch not rejected. ``rows``: the calibration draw as a
    sequence of the prompts' indices, in testing order (repeats allowed: a draw with replacement, already in a
    random order); default every prompt once, in :func:`prompt_order` of ``seed``. Returns (lambda, feasible): not
    feasible when not even the losses at ``lam_max`` are rejected (lambda is then ``lam_max``)."""
    order = prompt_order(len(st.start), seed) if rows is None else np.asarray(rows)
    tested, position = np.unique(order, return_inverse=True)  # the prompts drawn; each test's prompt among them
    current = np.array(st.end, dtype=float)[tested]
    if not betting_rejects(current, tau, delta, bounds, position):
        return float(lam_max), False
    # only the changes of the drawn prompts make stretches: each distinct crossing lambda of theirs starts one;
    # below it the losses are the ones at it with its changes undone
    keep = np.isin(st.prompt, tested)
    lam_k, prompt_k, delta_k = st.lam[keep], np.searchsorted(tested, st.prompt[keep]), st.delta[keep]
    lams, stretch = np.unique(lam_k, return_inverse=True)
    for hi_i in range(len(lams) - 1, -1, -block):
        lo_i = max(-1, hi_i - block)
        span = (stretch > lo_i) & (stretch <= hi_i)
        undo = np.zeros((hi_i - lo_i, len(tested)))  # row r: the changes at lams[hi_i - r]
        np.add.at(undo, (hi_i - stretch[span], prompt_k[span]), delta_k[span])
        batch = current[None, :] - np.cumsum(undo, axis=0)
        rejected = betting_rejects(batch, tau, delta, bounds, position)
        if not rejected.all():
            stop = int(np.argmin(rejected))  # the first stretch (from the top) not rejected
            return float(lams[hi_i - stop]), True
        current = batch[-1]
    return 0.0, True
