"""Exact Best-of-N calibration for any N <= K. Pure numpy, no I/O.

A prompt has K scored samples from pi_ref. The Best-of-N decoder draws N candidates and keeps the
argmax of r - lam c. If the N candidates are a uniformly random N-subset of the K samples, the
sample ranked j-th from the bottom (1-based, by :func:`order`) is the winner with probability

    p_j = C(j - 1, N - 1) / C(K, N)

(it must be drawn, and the other N - 1 drawn ones must all rank below it), so the prompt's
expected Best-of-N cost is the U-statistic v(lam) = sum_j p_j c_(j)(lam), exactly. v is piecewise
constant in lam and nonincreasing: it changes only where two samples' scores cross, at
lam_ab = (r_a - r_b) / (c_a - c_b), where the lower-cost sample a overtakes b and v changes by
(p_{j+1} - p_j) (c_a - c_b) <= 0 (j the rank the pair shares). Ties rank the lower cost higher
(then the lower sample index), which is the decoder's rule too, so v at a crossing already has the
value after it: the smallest lam with mean v <= tau is attained, at a crossing.

The bootstrap reweights prompts by multinomial counts; every replicate's root is found exactly:
a coarse grid (matrix product of the weights with per-prompt cumulative changes), a fine grid
inside the bracketing cell, then a scan over the crossings inside the fine cell.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import gammaln

GRID_MIN = 16  # a shorter grid (or one shorter than K / 2) is cheaper per lam
TIE_RTOL = 1e-12  # scores within this (relative, at least absolute 1e-12) of each other are tied


# ---------------------------------------------------------------------------------------------
# The decoder's order (shared with lara.decode.bon)


def _flat(idx: np.ndarray) -> np.ndarray:
    """Indices into the flattened (P, K) array of each row's column ``idx`` (take_along_axis, cheaper)."""
    return idx + (np.arange(idx.shape[0]) * idx.shape[1])[:, None]


def order(reward: np.ndarray, cost: np.ndarray, lam: float, mask: np.ndarray | None = None, *,
          _full: bool = False) -> np.ndarray:
    """(P, K) sample indices per prompt, best first, by r - lam c: scores within ``TIE_RTOL`` of
    each other tie, a tie goes to the lower cost, then to the lower index. Masked samples last.
    Rows without a tie are sorted by score alone; only rows with one go through the full ranking.
    ``lam``: one lambda, or a (P, 1) column of each row's own."""
    score = reward - lam * cost
    if mask is not None:
        score = np.where(mask, score, -np.inf)
    if not _full:  # a row without ties has one order, however it is sorted: sort fast, check for ties
        by_score = np.argsort(-score, axis=1)
        s_sorted = score.ravel()[_flat(by_score)]
        with np.errstate(invalid="ignore"):  # nan (masked samples) counts as a tie here: re-ranked below
            slack = np.abs(s_sorted[:, :-1])  # gap minus tolerance between neighbours, in place (fewer temporaries)
            np.maximum(slack, 1.0, out=slack)
            slack *= -TIE_RTOL
            slack += s_sorted[:, :-1]
            slack -= s_sorted[:, 1:]
            tied = ~(slack.min(axis=1, initial=np.inf) > 0)
        if tied.any():
            rows = np.flatnonzero(tied)
            by_score[rows] = order(reward[rows], cost[rows], _at_rows(lam, rows), None if mask is None else mask[rows],
                                   _full=True)
        return by_score
    by_score = np.argsort(-score, axis=1, kind="stable")
    s_sorted = np.take_along_axis(score, by_score, axis=1)
    with np.errstate(invalid="ignore"):
        gap = s_sorted[:, :-1] - s_sorted[:, 1:]
        tol = TIE_RTOL * np.maximum(1.0, np.abs(s_sorted[:, :-1]))
        new_group = ~(gap <= tol)  # -inf - -inf is nan: masked samples form their own groups
    group = np.concatenate([np.zeros((len(score), 1), dtype=np.int64), np.cumsum(new_group, axis=1)], axis=1)
    c_sorted = np.take_along_axis(cost, by_score, axis=1)
    rank_in = np.lexsort((by_score, c_sorted, group), axis=1)
    return np.take_along_axis(by_score, rank_in, axis=1)


def select(reward: np.ndarray, cost: np.ndarray, lam: float, mask: np.ndarray | None = None) -> np.ndarray:
    """(P,) index of the Best-of-N choice per prompt: the first of :func:`order`. A prompt whose best
    score leads the second by more than the tie tolerance takes the plain argmax; only prompts with a
    tie at the top go through the full order (the same answer, without sorting every prompt). ``lam``: one
    lambda, or a (P, 1) column of each row's own."""
    score = reward - lam * cost
    if mask is not None:
        score = np.where(mask, score, -np.inf)
    pick = np.argmax(score, axis=1)
    best = score[np.arange(len(score)), pick]
    with np.errstate(invalid="ignore"):  # how many samples lie within the tie tolerance of the best
        close = (score >= (best - TIE_RTOL * np.maximum(1.0, np.abs(best)))[:, None]).sum(axis=1)
    clear = (close == 1) & np.isfinite(best)
    if not clear.all():
        rows = np.flatnonzero(~clear)
        pick[rows] = order(reward[rows], cost[rows], _at_rows(lam, rows), None if mask is None else mask[rows])[:, 0]
    return pick


def _at_rows(lam, rows):
    """The lambda of the rows ``rows``: one for all, or theirs of a per-row column."""
    return lam[rows] if np.ndim(lam) else lam


def select_grid(reward: np.ndarray, cost: np.ndarray, lams) -> np.ndarray:
    """(L, P) :func:`select` at every lam of a grid, equal to calling it per lam.

    As lam grows, the argmax of r - lam c only ever moves to a strictly cheaper sample, at the lam
    where that sample's line crosses the winner's, so a prompt changes winner at most K - 1 times.
    The winners are followed from crossing to crossing (at most K - 1 rounds over the prompts whose
    path goes on, each one pass over their samples) instead of an argmax over all samples per lam.
    Grid points where the decoder's tie rule could act (within a widened tie tolerance of a crossing
    with a cheaper sample, or an equal-cost sample tied in reward) are handed to :func:`select`."""
    lams = np.atleast_1d(np.asarray(lams, dtype=np.float64)).ravel()
    n_lam, (n_prompt, k) = len(lams), reward.shape
    if n_lam < max(GRID_MIN, k // 2) or not (np.isfinite(lams).all() and np.isfinite(reward).all()
                                              and np.isfinite(cost).all()):
        return np.stack([select(reward, cost, lam) for lam in lams]).reshape(n_lam, n_prompt)
    by_lam = np.argsort(lams, kind="stable")
    grid = lams[by_lam]
    # widest tie tolerance the decoder can apply on this grid (a chain of K ties), with room for rounding
    bound = np.abs(reward).max(axis=1) + np.abs(grid).max() * np.abs(cost).max(axis=1)
    tol = 2.0 * (k + 1) * TIE_RTOL * np.maximum(1.0, bound)
    # equal costs, rewards apart but inside the tolerance: the decoder breaks that tie by index, which the
    # walk below does not follow; such prompts go to select at every lam (exact copies need no care)
    twins = (np.diff(np.sort(cost, axis=1), axis=1) == 0).any(axis=1)  # rows with equal costs at all
    if twins.any():
        rows = np.flatnonzero(twins)
        by_cost = np.lexsort((reward[rows], cost[rows]), axis=1)
        c_s, r_s = cost[rows].ravel()[_flat(by_cost)], reward[rows].ravel()[_flat(by_cost)]
        gap = np.diff(r_s, axis=1)
        twins[rows] = ((np.diff(c_s, axis=1) == 0) & (gap > 0) & (gap <= tol[rows, None])).any(axis=1)
    first = select(reward, cost, grid[0])
    ev_prompt, ev_start, ev_win = [np.arange(n_prompt)], [np.zeros(n_prompt, dtype=np.int64)], [first]
    hand_prompt = [np.flatnonzero(twins)]  # grid ranges [lo, hi) of a prompt handed to select
    hand_lo, hand_hi = [np.zeros(len(hand_prompt[0]), dtype=np.int64)], [np.full(len(hand_prompt[0]), n_lam)]
    live, win, start = np.flatnonzero(~twins), first.copy(), np.zeros(n_prompt, dtype=np.int64)
    while live.size:
        w, begin = win[live], start[live]
        dc = cost[live, w][:, None] - cost[live]  # > 0: a cheaper sample, which overtakes w at dr / dc
        dr = reward[live, w][:, None] - reward[live]
        cheaper = dc > 0
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            cross = np.divide(dr, dc, out=np.full_like(dc, np.inf), where=cheaper)
            dr -= tol[live, None]  # from (dr - tol) / dc on, the decoder may see a tie with that sample
            near = np.divide(dr, dc, out=np.full_like(dc, np.inf), where=cheaper).min(axis=1)
        near[np.isnan(near)] = -np.inf  # an overflowed crossing hands the rest of the grid to select
        nxt = np.argmin(cross, axis=1)
        at = cross[np.arange(live.size), nxt]  # nan sorts after the grid: no further winner
        lo = np.maximum(np.searchsorted(grid, near, "left"), begin)
        hi = np.maximum(np.searchsorted(grid, at, "left"), begin)
        ok = lo < hi
        hand_prompt.append(live[ok]), hand_lo.append(lo[ok]), hand_hi.append(hi[ok])
        go = hi < n_lam
        live, hi, nxt = live[go], hi[go], nxt[go]
        ev_prompt.append(live), ev_start.append(hi), ev_win.append(nxt)
        win[live], start[live] = nxt, hi
    # each prompt's winners in order of their start; a later one at the same start replaces the earlier
    ev_prompt, ev_start, ev_win = (np.concatenate(a) for a in (ev_prompt, ev_start, ev_win))
    seq = np.lexsort((np.arange(len(ev_prompt)), ev_prompt))
    ev_prompt, ev_start, ev_win = ev_prompt[seq], ev_start[seq], ev_win[seq]
    stop = np.append(ev_start[1:], n_lam)
    stop[np.flatnonzero(ev_prompt[1:] != ev_prompt[:-1])] = n_lam
    idx = np.repeat(ev_win, stop - ev_start).reshape(n_prompt, n_lam).T.copy()
    hand_prompt, hand_lo, hand_hi = (np.concatenate(a) for a in (hand_prompt, hand_lo, hand_hi))
    if hand_prompt.size:
        length = hand_hi - hand_lo
        at_lam = np.repeat(hand_lo - np.cumsum(length) + length, length) + np.arange(length.sum())
        rows_of = np.repeat(hand_prompt, length)
        seq = np.argsort(at_lam, kind="stable")
        at_lam, rows_of = at_lam[seq], rows_of[seq]
        bounds = np.flatnonzero(np.diff(at_lam)) + 1
        for li, rows in zip(at_lam[np.r_[0, bounds]], np.split(rows_of, bounds), strict=True):
            idx[li, rows] = select(reward[rows], cost[rows], grid[li])
    out = np.empty_like(idx)
    out[by_lam] = idx
    return out


# ---------------------------------------------------------------------------------------------
# Rank probabilities and the expected cost


def rank_probabilities(k: int, n: int) -> np.ndarray:
    """(k,) probability that the sample ranked q-th from the top (q = 0 best) wins Best-of-n over
    a uniformly random n-subset of k samples: C(k - q - 1, n - 1) / C(k, n)."""
    if not 1 <= n <= k:
        raise ValueError(f"Best-of-N needs 1 <= N <= K, got N = {n}, K = {k}")
    j = np.arange(k, 0, -1)  # rank from the bottom of the q-th best
    ok = j >= n
    logp = np.full(k, -np.inf)
    logp[ok] = (gammaln(j[ok]) - gammaln(n) - gammaln(j[ok] - n + 1)) - (gammaln(k + 1) - gammaln(n + 1)
                                                                          - gammaln(k - n + 1))
    p = np.exp(logp)
    return p / p.sum()


def _prob_table(counts: np.ndarray, kmax: int, n: int | None) -> np.ndarray:
    """(P, kmax) rank probabilities per prompt (its own K; n = None: n = K, the argmax of all its
    samples), zero on padded slots."""
    out = np.zeros((len(counts), kmax))
    for k in np.unique(counts):
        out[counts == k, :k] = rank_probabilities(int(k), int(k) if n is None else n)
    return out


def expected_cost(reward, cost, mask, lams, n: int | None) -> np.ndarray:
    """(P, L) exact expected Best-of-n cost per prompt at each lam (n = None: each prompt's K)."""
    return expected(reward, cost, mask, lams, n, cost)[0]


def expected(reward, cost, mask, lams, n: int | None, *values: np.ndarray) -> np.ndarray:
    """(V, P, L) exact expectation of each of ``values`` (P, K) at the Best-of-n choice, per prompt
    and lam (the order is computed once per lam for all of them)."""
    lams = np.atleast_1d(np.asarray(lams, dtype=np.float64))
    counts = mask.sum(axis=1)
    if n in (None, reward.shape[1]) and mask.all():  # Best-of-all: the value at the argmax
        pick = np.ascontiguousarray(select_grid(reward, cost, lams).T)  # (P, L)
        return np.stack([np.take_along_axis(v, pick, axis=1) for v in values])
    probs = _prob_table(counts, reward.shape[1], n)
    vals = np.stack([np.where(mask, v, 0.0) for v in values])
    out = np.empty((len(values), reward.shape[0], len(lams)))
    flat_vals = vals.reshape(len(values), -1)
    live = None if mask.all() else mask
    for t, lam in enumerate(lams):
        at = _flat(order(reward, cost, lam, live))
        for v, flat in enumerate(flat_vals):
            out[v, :, t] = (probs * flat[at]).sum(axis=1)
    return out


def expected_rows(reward, cost, mask, lams, n: int | None, *values: np.ndarray) -> np.ndarray:
    """(V, R) :func:`expected` of each row r of (R, K) arrays at its own lambda ``lams[r]``, one batch: what
    ``expected`` gives that row alone at that lambda, to the bit (a full row of Best-of-all takes the pick, any
    other the rank average)."""
    lams = np.asarray(lams, dtype=np.float64)[:, None]
    out = np.empty((len(values), len(reward)))
    whole = mask.all(axis=1) & (n in (None, reward.shape[1]))
    if whole.any():
        rows = np.flatnonzero(whole)
        pick = select(reward[rows], cost[rows], lams[rows]) + np.arange(len(rows)) * reward.shape[1]
        for j, v in enumerate(values):
            out[j, rows] = v[rows].ravel()[pick]
    if not whole.all():
        rows = np.flatnonzero(~whole)
        live = mask[rows]
        probs = _prob_table(live.sum(axis=1), reward.shape[1], n)
        at = _flat(order(reward[rows], cost[rows], lams[rows], live))
        for j, v in enumerate(values):
            out[j, rows] = (probs * np.where(live, v[rows], 0.0).ravel()[at]).sum(axis=1)
    return out


# ---------------------------------------------------------------------------------------------
# Where v changes: every crossing in (0, lam_max], with its change


@dataclass(frozen=True)
class Steps:
    """Every change of the prompts' expected costs on (0, lam_max], sorted by lam."""

    lam: np.ndarray  # (T,)
    prompt: np.ndarray  # (T,) int
    delta: np.ndarray  # (T,) <= 0
    start: np.ndarray  # (P,) expected cost at lam = 0
    end: np.ndarray  # (P,) expected cost at lam_max


BLOCK_BYTES = 16 * 2**20  # size of one (crossings, K) float64 temporary in :func:`steps`
PROMPT_BLOCK_BYTES = 64 * 2**20  # the per-pair and per-crossing arrays of one block of prompts


def steps(reward, cost, mask, n: int | None, lam_max: float, value: np.ndarray | None = None) -> Steps:
    """Every change of each prompt's expected Best-of-n cost on (0, lam_max] (n = None: each
    prompt's own K). ``value``: the expectation of another per-sample quantity at the Best-of-n choice
    (which still ranks by r - lam c), one that never increases when the cost decreases (the cost clipped
    to bounds, :mod:`lara.calibrate.certify`), so it too only steps down; default the cost itself."""
    p_count, kmax = reward.shape
    counts = mask.sum(axis=1)
    if n is not None and n > counts.min():
        raise ValueError(f"Best-of-N with N = {n} but a prompt has only K = {int(counts.min())} samples "
                         f"(N must be <= K)")
    value = cost if value is None else value
    probs = _prob_table(counts, kmax, n)
    start = expected(reward, cost, mask, [0.0], n, value)[0, :, 0]
    end = expected(reward, cost, mask, [lam_max], n, value)[0, :, 0]
    npairs = max(1, kmax * (kmax - 1) // 2)
    per_block = max(1, PROMPT_BLOCK_BYTES // (8 * 16 * npairs))  # ~16 arrays of (prompts, pairs) or crossings
    kept, messy = [], []  # (lams, prompts, changes) of every block: the clean crossings, then the recomputed ones
    for p0 in range(0, p_count, per_block):
        sl = slice(p0, p0 + per_block)
        for acc, part in zip((kept, messy), _block_steps(reward[sl], cost[sl], mask[sl], counts[sl], probs[sl], n,
                                                         lam_max, value[sl]), strict=True):
            acc += [(lam, q + p0, d) for lam, q, d in part]
    if not kept + messy:
        return Steps(np.empty(0), np.empty(0, dtype=np.int64), np.empty(0), start, end)
    lam_all, p_all, d_all = (np.concatenate(a) for a in zip(*kept, *messy, strict=True))
    srt = np.argsort(lam_all, kind="stable")
    return Steps(lam_all[srt], p_all[srt].astype(np.int64), d_all[srt], start, end)


def _block_steps(reward, cost, mask, counts, probs, n, lam_max, value):
    """:func:`steps` for a block of prompts (indices local to the block): the clean crossings, and
    the changes of the prompts with ties recomputed from their expected cost."""
    kmax = reward.shape[1]
    a, b = np.triu_indices(kmax, 1)
    ra, rb, ca, cb = reward[:, a], reward[:, b], cost[:, a], cost[:, b]
    valid = mask[:, a] & mask[:, b] & (ca != cb)
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (ra - rb) / (ca - cb)
    valid &= (cross > 0) & (cross <= lam_max)
    pi, pair = np.nonzero(valid)
    lam = cross[pi, pair]
    if len(lam) == 0:
        return [], []
    ia, ib = a[pair], b[pair]
    # the lower-cost sample overtakes the other: put it in `lo`
    swap = cost[pi, ia] > cost[pi, ib]
    lo = np.where(swap, ib, ia)
    hi = np.where(swap, ia, ib)
    # scores of every sample of the prompt at the crossing, relative to the pair's common score: how
    # many lie below it and how many tie (2 for a clean crossing), a block of crossings at a time so
    # the (crossings, K) temporaries stay small (N = 20,000 prompts x K = 20 has ~4M crossings)
    below = np.empty(len(lam), dtype=np.int64)
    tied = np.empty(len(lam), dtype=np.int64)
    block = max(1024, BLOCK_BYTES // (8 * kmax))
    for s0 in range(0, len(lam), block):
        sl = slice(s0, s0 + block)
        p, lam_b, lo_b = pi[sl], lam[sl], lo[sl]
        s_star = reward[p, lo_b] - lam_b * cost[p, lo_b]
        tol = TIE_RTOL * np.maximum(1.0, np.abs(s_star))
        diff = reward[p] - lam_b[:, None] * cost[p] - s_star[:, None]
        live = mask[p]
        below[sl] = ((diff < -tol[:, None]) & live).sum(axis=1)
        tied[sl] = ((np.abs(diff) <= tol[:, None]) & live).sum(axis=1)
    # rank from the top of the higher of the two after the swap: (K_i - 1 - below) - 1 ... from the bottom j = below + 1
    k_i = counts[pi]
    q_low = k_i - 1 - below  # top-rank index of the pair's lower slot (rank below + 1 from the bottom)
    q_high = q_low - 1
    p_low = probs[pi, q_low]
    p_high = probs[pi, q_high]
    delta = (p_high - p_low) * (value[pi, lo] - value[pi, hi])
    # several samples tied at one crossing, or two crossings of a prompt at the same lam: the
    # prompt's changes are recomputed from its expected cost at each of its crossings
    dup = _same_lam_in_prompt(pi, lam)
    messy = np.unique(pi[(tied > 2) | dup])
    keep = ~np.isin(pi, messy) & (delta != 0)
    recomputed = []
    for i in messy:
        pts = np.unique(lam[pi == i])
        v = expected(reward[i:i + 1], cost[i:i + 1], mask[i:i + 1], np.concatenate([[0.0], pts]), n,
                     value[i:i + 1])[0, 0]
        d = np.diff(v)  # exactly <= 0; sums taken in different orders round: drop that noise
        nz = d < -1e-12 * np.maximum(1.0, np.abs(v[1:]))
        recomputed.append((pts[nz], np.full(nz.sum(), i), d[nz]))
    return [(lam[keep], pi[keep], delta[keep])], recomputed


def _same_lam_in_prompt(pi: np.ndarray, lam: np.ndarray) -> np.ndarray:
    """True for crossings that share their lam (within tolerance) with another of the same prompt."""
    srt = np.lexsort((lam, pi))
    ps, ls = pi[srt], lam[srt]
    close = (ps[1:] == ps[:-1]) & (np.abs(ls[1:] - ls[:-1]) <= TIE_RTOL * np.maximum(1.0, np.abs(ls[1:])))
    flag = np.zeros(len(lam), dtype=bool)
    flag[srt[1:][close]] = True
    flag[srt[:-1][close]] = True
    return flag


# ---------------------------------------------------------------------------------------------
# Roots: the smallest lam whose (weighted) mean expected cost is <= tau


def roots(st: Steps, weights: np.ndarray, tau: float, lam_max: float, coarse: int = 64,
          fine: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """For each row of ``weights`` (B, P) (prompt weights summing to 1): the smallest lam in
    [0, lam_max] with sum_i w_i v_i(lam) <= tau, and a status (0 interior, 1 inactive:
    already at lam = 0, 2 infeasible: not even at lam_max, reported as lam_max). Exact."""
    w = np.atleast_2d(weights)
    tau = tau + _eps(tau)  # compare sums with a rounding slack, the same at every level
    at0 = w @ st.start
    atmax = w @ st.end
    out = np.full(len(w), float(lam_max))
    status = np.full(len(w), 2, dtype=np.int8)
    inactive = at0 <= tau
    out[inactive], status[inactive] = 0.0, 1
    rows = np.flatnonzero(~inactive & (atmax <= tau))
    status[rows] = 0
    if len(rows) == 0:
        return out, status
    n = len(st.start)
    # level 1: coarse cells of [0, lam_max]
    edges = np.linspace(0.0, lam_max, coarse + 1)
    edges[-1] = lam_max
    cell = np.clip(np.searchsorted(edges, st.lam, side="left"), 1, coarse)  # lam in (edges[c-1], edges[c]]
    cum = _cumulative(st.prompt, st.delta, cell, n, coarse)  # (n, coarse + 1) change up to each edge
    path = at0[rows, None] + w[rows] @ cum
    c = np.argmax(path <= tau, axis=1)  # first edge at or below tau (>= 1)
    base_lo = path[np.arange(len(rows)), c - 1]
    for cc in np.unique(c):
        sel = c == cc
        r_sel = rows[sel]
        in_cell = cell == cc
        lo_edge, hi_edge = edges[cc - 1], edges[cc]
        sub = np.linspace(lo_edge, hi_edge, fine + 1)
        sub[-1] = hi_edge
        lam_c, p_c, d_c = st.lam[in_cell], st.prompt[in_cell], st.delta[in_cell]
        fcell = np.clip(np.searchsorted(sub, lam_c, side="left"), 1, fine)
        cum2 = _cumulative(p_c, d_c, fcell, n, fine)
        path2 = base_lo[sel, None] + w[r_sel] @ cum2
        f = np.argmax(path2 <= tau, axis=1)
        f = np.maximum(f, 1)
        base2 = path2[np.arange(len(r_sel)), f - 1]
        # level 3: scan the crossings inside each replicate's fine cell
        for ff in np.unique(f):
            sel2 = f == ff
            r2 = r_sel[sel2]
            in_f = fcell == ff
            lam_f, p_f, d_f = lam_c[in_f], p_c[in_f], d_c[in_f]
            scan = base2[sel2, None] + np.cumsum(w[np.ix_(r2, p_f)] * d_f, axis=1)
            hit = scan <= tau
            first = np.argmax(hit, axis=1)
            found = hit.any(axis=1)
            out[r2] = np.where(found, lam_f[first] if len(lam_f) else sub[ff], sub[ff])
    return out, status


def _eps(tau: float) -> float:
    """Rounding slack of a weighted sum compared with tau (the sums are accumulated differently
    on the grid and in the scan)."""
    return 1e-12 * max(1.0, abs(tau))


def _cumulative(prompt, delta, cell, n: int, cells: int) -> np.ndarray:
    """(n, cells + 1): per prompt, the total change at lam <= each edge (edge 0 = the start)."""
    per = np.zeros((n, cells + 1))
    np.add.at(per, (prompt, cell), delta)
    return np.cumsum(per, axis=1)
