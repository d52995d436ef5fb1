"""The LARA dual, its bisection, and a fast exact-at-the-grid bootstrap. Pure numpy, no I/O.

For prompt i with samples k (from pi_ref), a_ik(lam) = (r_ik - lam c_ik) / beta and

    g(lam)  = (1/N) sum_i beta * logmeanexp_k a_ik(lam) + lam tau
    g'(lam) = tau - (1/N) sum_i cbar_i(lam),   cbar_i = sum_k softmax_k(a_i.) c_ik
    g''(lam) = (1/(N beta)) sum_i Var_softmax(c_i.) >= 0

so g' is nondecreasing and the minimiser over [0, Lambda] is found by bisection on g'.
In the Best-of-N limit (beta -> 0, ``mode="bon"``) the softmax becomes the argmax of
r - lam c (ties go to the lower cost, the limit from the right) and g' is a step function;
``mode="bon"`` with ``bon_n = N <= K`` is exact for Best-of-N over N of the K samples
(:mod:`lara.calibrate.bestofn`, which solves and bootstraps that mode).

Covariate-shift weights (``weights``, Best-of-N mode only): the prompts' mean becomes the weighted mean
sum_i w_i v_i / sum_i w_i, and a bootstrap replicate resamples prompts uniformly (multinomial counts n_b) and
keeps each drawn prompt's weight, n_bi w_i / sum_j n_bj w_j: the bootstrap of the weighted estimator itself
(why not draws proportional to w: docs/shift.md). Weights all equal are no reweighting: pass None.

Bootstrap. A replicate reweights prompts by multinomial counts n_b, and
g'_b(lam) = tau - sum_i (n_bi / N) cbar_i(lam). The per-prompt curves cbar_i do not
depend on the replicate, so they are computed once on shared grids and combined with a
matrix product; each replicate is bracketed exactly (signs of g'_b evaluated exactly at
grid points) to a fine cell of width Lambda / (coarse * fine), inside which the root of
the cubic Hermite interpolant (exact values and exact derivatives at both ends) is taken.
In Best-of-N mode the replicate roots are exact breakpoints of the step function.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lara.stats import resample_weights

MODES = ("soft", "bon")


class InputError(ValueError):
    """Scores the calibration cannot use (NaN/inf, empty, ...)."""


@dataclass(frozen=True)
class PromptScores:
    """Per-prompt samples, padded to a rectangle: ``mask[i, k]`` marks real samples."""

    reward: np.ndarray  # (N, K) float64, 0 where padded
    cost: np.ndarray  # (N, K)
    mask: np.ndarray  # (N, K) bool
    prompt_ids: np.ndarray  # (N,)

    @property
    def n_prompts(self) -> int:
        return self.reward.shape[0]

    @property
    def counts(self) -> np.ndarray:
        return self.mask.sum(axis=1)

    @classmethod
    def from_long(cls, prompt_id, reward, cost) -> PromptScores:
        """From one row per response (prompts may have different numbers of samples)."""
        prompt_id = np.asarray(prompt_id)
        reward = np.asarray(reward, dtype=np.float64)
        cost = np.asarray(cost, dtype=np.float64)
        if not (len(prompt_id) == len(reward) == len(cost)):
            raise InputError("prompt_id, reward and cost must have the same length")
        if len(reward) == 0:
            raise InputError("no scores")
        for name, arr in (("reward", reward), ("cost", cost)):
            bad = np.flatnonzero(~np.isfinite(arr))
            if len(bad):
                raise InputError(f"column {name!r} holds a non-finite value ({arr[bad[0]]}) at row "
                                 f"{bad[0]}" + (f" and {len(bad) - 1} more rows" if len(bad) > 1 else ""))
        ids, inverse = np.unique(prompt_id, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        per_prompt = np.bincount(inverse, minlength=len(ids))
        kmax = int(per_prompt.max())
        start = np.concatenate([[0], np.cumsum(per_prompt)[:-1]])
        slot = np.arange(len(order)) - np.repeat(start, per_prompt)
        rows = inverse[order]
        r = np.zeros((len(ids), kmax))
        c = np.zeros((len(ids), kmax))
        m = np.zeros((len(ids), kmax), dtype=bool)
        r[rows, slot], c[rows, slot], m[rows, slot] = reward[order], cost[order], True
        return cls(r, c, m, ids)


# ---------------------------------------------------------------------------------------------
# Per-prompt curves


def tilted_moments(s: PromptScores, lams, beta: float, chunk: int = 32):
    """For each prompt and each lam: (logmeanexp_k a_ik, cbar_i, Var_i) under the tilted
    softmax, computed stably (max-shifted logsumexp; moments of the cost centred per
    prompt). Arrays of shape (N, len(lams))."""
    lams = np.atleast_1d(np.asarray(lams, dtype=np.float64))
    n, g = s.n_prompts, len(lams)
    lme, cbar, var = np.empty((n, g)), np.empty((n, g)), np.empty((n, g))
    log_k = np.log(s.counts)
    full = bool(s.mask.all())
    centre = (s.cost * s.mask).sum(axis=1) / s.counts
    cc = np.where(s.mask, s.cost - centre[:, None], 0.0)
    cc2 = cc * cc
    r_b = (s.reward / beta)[:, :, None]
    c_b = (s.cost / beta)[:, :, None]
    for lo in range(0, g, chunk):
        lam = lams[lo:lo + chunk]
        a = r_b - c_b * lam
        if not full:
            a[~s.mask] = -np.inf
        top = a.max(axis=1)
        np.subtract(a, top[:, None, :], out=a)
        e = np.exp(a, out=a)
        z = e.sum(axis=1)
        m1 = np.einsum("nkg,nk->ng", e, cc) / z
        m2 = np.einsum("nkg,nk->ng", e, cc2) / z
        lme[:, lo:lo + chunk] = top + np.log(z) - log_k[:, None]
        cbar[:, lo:lo + chunk] = centre[:, None] + m1
        var[:, lo:lo + chunk] = np.maximum(m2 - m1 * m1, 0.0)
    return lme, cbar, var


def mean_cost(s: PromptScores, lams, beta: float, mode: str = "soft", weights=None,
              bon_n: int | None = None) -> np.ndarray:
    """(Weighted) mean over prompts of the tilted (or exact Best-of-n, ties as the decoder breaks them:
    :func:`lara.calibrate.bestofn.expected_cost`) expected cost at each lam."""
    from lara.calibrate.bestofn import expected_cost

    cbar = expected_cost(s.reward, s.cost, s.mask, lams, bon_n) if mode == "bon" else tilted_moments(s, lams, beta)[1]
    w = np.full(s.n_prompts, 1.0 / s.n_prompts) if weights is None else np.asarray(weights)
    return w @ cbar


def _normalised(weights) -> np.ndarray | None:
    """Prompt weights summing to one (None stays None: equal weights)."""
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    return w / w.sum()


def dual(s: PromptScores, lams, tau: float, beta: float, mode: str = "soft", weights=None) -> np.ndarray:
    """g(lam). In Best-of-N mode beta * logmeanexp -> max_k (r - lam c) - 0 (the beta -> 0
    limit of beta * logmeanexp, the log K / beta term vanishing with beta). ``weights``: the prompts'
    covariate-shift weights (Best-of-N mode; None: equal)."""
    lams = np.atleast_1d(np.asarray(lams, dtype=np.float64))
    if mode == "bon":
        best = np.stack([np.where(s.mask, s.reward - lam * s.cost, -np.inf).max(axis=1) for lam in lams], 1)
        mean = best.mean(axis=0) if weights is None else _normalised(weights) @ best
        return mean + lams * tau
    _no_weights(weights)
    lme = tilted_moments(s, lams, beta)[0]
    return beta * lme.mean(axis=0) + lams * tau


def dual_grad(s: PromptScores, lams, tau: float, beta: float, mode: str = "soft",
              bon_n: int | None = None, weights=None) -> np.ndarray:
    """g'(lam) = tau - mean cbar(lam) (Best-of-N: tau - the (weighted) mean expected Best-of-n cost)."""
    return tau - mean_cost(s, lams, beta, mode, weights=_normalised(weights), bon_n=bon_n)


def _no_weights(weights) -> None:
    if weights is not None:
        raise ValueError("covariate-shift weights are for Best-of-N mode only (calibration.mode: bon): soft mode's "
                         "tilted cost is a ratio estimate, not a mean of per-prompt losses")


# ---------------------------------------------------------------------------------------------
# Solving


@dataclass(frozen=True)
class Solution:
    lam: float
    status: str  # "inactive" (g'(0) >= 0), "interior", or "infeasible" (g'(Lambda) < 0)
    cost_range: tuple[float, float]  # reachable mean cost: (at Lambda, at 0)
    iterations: int = 0

    @property
    def feasible(self) -> bool:
        return self.status != "infeasible"


def solve(s: PromptScores, tau: float, beta: float, lam_max: float, tol: float = 1e-8,
          mode: str = "soft", bon_n: int | None = None, bon_steps=None, weights=None) -> Solution:
    """Minimise g over [0, lam_max] by bisection on g' to ``tol`` in lam.

    g'(0) >= 0: the constraint is inactive, lam = 0. g'(lam_max) < 0: tau is not reachable
    within [0, lam_max]; lam = lam_max is returned with status "infeasible" (never silently).
    Best-of-N mode is exact: the smallest lam whose expected Best-of-n cost is <= tau (``weights``: its
    weighted mean over prompts, the covariate-shift weights; None: the plain mean).
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if mode == "bon":
        from lara.calibrate.bestofn import roots, steps

        st = bon_steps or steps(s.reward, s.cost, s.mask, bon_n, lam_max)
        w = np.full((1, s.n_prompts), 1.0 / s.n_prompts) if weights is None else _normalised(weights)[None, :]
        lam, status = roots(st, w, tau, lam_max)
        cost_range = ((float(st.end.mean()), float(st.start.mean())) if weights is None
                      else (float(w[0] @ st.end), float(w[0] @ st.start)))
        return Solution(float(lam[0]), ("interior", "inactive", "infeasible")[status[0]], cost_range, 0)
    _no_weights(weights)
    ends = mean_cost(s, [0.0, lam_max], beta, mode)
    cost_range = (float(ends[1]), float(ends[0]))
    if tau - ends[0] >= 0:
        return Solution(0.0, "inactive", cost_range)
    if tau - ends[1] < 0:
        return Solution(float(lam_max), "infeasible", cost_range)
    lo, hi, it = 0.0, float(lam_max), 0
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if tau - mean_cost(s, [mid], beta, mode)[0] >= 0:
            hi = mid
        else:
            lo = mid
        it += 1
    return Solution(0.5 * (lo + hi), "interior", cost_range, it)


# ---------------------------------------------------------------------------------------------
# Bootstrap


CHUNK_BUDGET = 160 * 2**20  # bytes of the (replicates, prompts) arrays one bootstrap chunk holds at once


def chunk_for(n_prompts: int, budget: int = CHUNK_BUDGET, arrays: int = 6) -> int:
    """Replicates per bootstrap chunk: as many as keep ``arrays`` float64 (chunk, N) arrays (the
    weights, the resample indices, the gathered curves) within ``budget``, between 16 and 1000. The
    draws do not depend on it (numpy's generator yields the same stream in any chunking)."""
    return int(np.clip(budget // (8 * arrays * max(n_prompts, 1)), 16, 1000))


def resample_indices(seed: int, n: int, b: int, chunk: int = 1000):
    """The prompt indices of every replicate, in the order :func:`bootstrap` draws them
    (for reference implementations)."""
    rng = np.random.default_rng(seed)
    for lo in range(0, b, chunk):
        yield from rng.integers(0, n, size=(min(chunk, b - lo), n), dtype=np.int32)


@dataclass(frozen=True)
class Bootstrap:
    lams: np.ndarray  # (B,) the replicate minimisers
    status: np.ndarray  # (B,) 0 interior, 1 inactive, 2 infeasible


def _hermite_root(x0, h, y0, y1, d0, d1, iters: int = 60):
    """Root in [x0, x0 + h] of the cubic Hermite interpolant (values y, slopes d) of an
    increasing function with y0 < 0 <= y1, by vectorised bisection on the cubic."""
    lo, hi = np.zeros_like(y0), np.ones_like(y0)
    m0, m1 = d0 * h, d1 * h
    for _ in range(iters):
        t = 0.5 * (lo + hi)
        t2, t3 = t * t, t * t * t
        y = (2 * t3 - 3 * t2 + 1) * y0 + (t3 - 2 * t2 + t) * m0 + (-2 * t3 + 3 * t2) * y1 + (t3 - t2) * m1
        up = y >= 0
        hi = np.where(up, t, hi)
        lo = np.where(up, lo, t)
    return x0 + 0.5 * (lo + hi) * h


def bootstrap(s: PromptScores, tau: float, beta: float, lam_max: float, n_boot: int, seed: int,
              mode: str = "soft", coarse: int = 16, fine: int = 256, chunk: int | None = None,
              bon_n: int | None = None, bon_steps=None, weights=None) -> Bootstrap:
    """Minimisers of the dual for ``n_boot`` resamples of the prompts (see module docstring); the
    replicates are processed ``chunk`` at a time (default: :func:`chunk_for` the number of prompts).
    ``weights``: the prompts' covariate-shift weights (Best-of-N mode), carried by each drawn prompt."""
    chunk = chunk or chunk_for(s.n_prompts)
    if mode == "bon":  # exact: each replicate's first crossing where its (weighted) mean Best-of-n cost is <= tau
        from lara.calibrate.bestofn import roots, steps

        st = bon_steps or steps(s.reward, s.cost, s.mask, bon_n, lam_max)

        def chunk_roots(w):
            if weights is not None:  # each drawn prompt keeps its weight (module docstring)
                w *= np.asarray(weights, dtype=np.float64)
                w /= w.sum(axis=1, keepdims=True)
            return roots(st, w, tau, lam_max)
    else:
        _no_weights(weights)
        chunk_roots = _soft_roots(s, tau, beta, lam_max, coarse, fine)
    rng = np.random.default_rng(seed)
    lams = np.empty(n_boot)
    status = np.zeros(n_boot, dtype=np.int8)
    for lo in range(0, n_boot, chunk):
        w = resample_weights(rng, s.n_prompts, min(chunk, n_boot - lo))
        lams[lo:lo + len(w)], status[lo:lo + len(w)] = chunk_roots(w)
    return Bootstrap(lams, status)


def _soft_roots(s: PromptScores, tau: float, beta: float, lam_max: float, coarse: int, fine: int):
    """The soft dual's root finder for a chunk of replicate weights (b, N) -> (roots, statuses): bracketed on a
    coarse grid, then to a fine cell, then the cubic Hermite root inside it (module docstring)."""
    n = s.n_prompts
    grid = np.linspace(0.0, lam_max, coarse + 1)
    _, cg, vg = tilted_moments(s, grid, beta)
    h_fine = lam_max / (coarse * fine)
    # per-prompt curves at the fine grid points visited so far, stored one row per point
    fine_cols: dict[int, int] = {}
    fine_c = np.empty((64, n))
    fine_v = np.empty((64, n))

    def rows_of(points: np.ndarray) -> np.ndarray:
        nonlocal fine_c, fine_v
        new = [int(p) for p in np.unique(points) if int(p) not in fine_cols]
        if new:
            _, c_new, v_new = tilted_moments(s, np.asarray(new) * h_fine, beta)
            first = len(fine_cols)
            if first + len(new) > len(fine_c):
                grow = max(2 * len(fine_c), first + len(new))
                fine_c = np.resize(fine_c, (grow, n))
                fine_v = np.resize(fine_v, (grow, n))
            fine_c[first:first + len(new)] = c_new.T
            fine_v[first:first + len(new)] = v_new.T
            fine_cols.update((p, first + i) for i, p in enumerate(new))
        return np.fromiter((fine_cols[int(p)] for p in points), dtype=np.int64, count=len(points))

    def chunk_roots(w):
        gp = tau - w @ cg  # (b, coarse + 1), nondecreasing along lam
        dgp = (w @ vg) / beta  # g''
        out = np.empty(len(w))
        st = np.zeros(len(w), dtype=np.int8)
        inactive = gp[:, 0] >= 0
        infeasible = (gp[:, -1] < 0) & ~inactive
        st[inactive], out[inactive] = 1, 0.0
        st[infeasible], out[infeasible] = 2, lam_max
        rows = np.flatnonzero(~inactive & ~infeasible)
        if len(rows):
            j = np.argmax(gp[rows] >= 0, axis=1)  # first grid point at or above 0 (j >= 1)
            h = grid[1] - grid[0]
            est = _hermite_root(grid[j - 1], h, gp[rows, j - 1], gp[rows, j], dgp[rows, j - 1], dgp[rows, j])
            f = np.clip(np.floor(est / h_fine).astype(np.int64), (j - 1) * fine, j * fine - 1)
            wr = w[rows]
            pending = np.ones(len(rows), dtype=bool)
            y0 = y1 = d0 = d1 = None
            for _ in range(coarse * fine):
                c0, c1 = rows_of(f), rows_of(f + 1)
                y0 = tau - np.einsum("bn,bn->b", wr, fine_c[c0])
                y1 = tau - np.einsum("bn,bn->b", wr, fine_c[c1])
                left, right = y0 >= 0, y1 < 0
                pending = left | right
                if not pending.any():
                    break
                f = np.where(left, f - 1, np.where(right, f + 1, f))
            d0 = np.einsum("bn,bn->b", wr, fine_v[c0]) / beta
            d1 = np.einsum("bn,bn->b", wr, fine_v[c1]) / beta
            out[rows] = _hermite_root(f * h_fine, h_fine, y0, y1, d0, d1)
        return out, st

    return chunk_roots
