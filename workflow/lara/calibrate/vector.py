"""Several constraints at once: a vector lambda for Best-of-N. Pure numpy/scipy, no I/O.

With m cost models the decoder ranks by r - sum_j lam_j c_j (ties to the lower combined cost, then the lower
sample index: the scalar decoder's order on the combined cost, :func:`lara.calibrate.bestofn.order`), and
each constraint asks E[c_j] <= tau_j. Three pieces, each exact or convex:

* **The expected cost vector** of a prompt at any lam (:func:`expected_vector`): the scalar machinery's rank
  average with the combined cost as the ranking cost and each c_j as the value averaged.
* **Along a ray** lam = s d (d >= 0 fixed), every prompt's expected cost vector is piecewise constant in s and
  changes only where two samples' combined scores cross, at s = (r_a - r_b) / (d.c_a - d.c_b). Unlike the
  scalar case a single constraint's cost need not fall as s grows (a step that lowers the combined cost may
  raise c_2), so :func:`ray_path` evaluates every prompt's vector at every one of its crossings (exactly) and
  :func:`first_feasible` scans the whole path for the smallest s where every mean is at or below its tau.
* **The soft dual** (:func:`soft_dual`): g(lam) = beta mean_i log mean_k exp((r_ik - lam.c_ik) / beta) + lam.tau,
  convex in lam in R^m_+, gradient tau - mean_i E_tilt_i[c]; minimised by L-BFGS-B on [0, Lambda]^m with that
  exact gradient. Its minimiser makes the Gibbs tilt meet every active constraint (complementary slackness);
  here it chooses the ray's direction d, and Best-of-N is then calibrated exactly along it.

The ray's direction is chosen from data, so a guarantee along it needs the direction fixed before the prompts
it is tested on are seen (Pareto Testing: choose on one split, test on the other); see :func:`ltt_along`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lara.calibrate.bestofn import TIE_RTOL, expected, expected_rows


def combined(costs: np.ndarray, lam) -> np.ndarray:
    """(P, K) combined cost sum_j lam_j c_j of (P, K, m) costs."""
    return np.tensordot(costs, np.asarray(lam, dtype=float), axes=([2], [0]))


def columns(a: np.ndarray) -> list[np.ndarray]:
    """The (P, K) slices of (P, K, m) costs, one per constraint."""
    return [a[..., j] for j in range(a.shape[2])]


def expected_at(reward: np.ndarray, costs: np.ndarray, mask: np.ndarray, lam, n: int | None, *values) -> np.ndarray:
    """(V, P) the exact expectation of each of ``values`` (P, K) at the Best-of-n choice of the vector ``lam``."""
    return expected(reward, combined(costs, lam), mask, [1.0], n, *values)[:, :, 0]


def expected_vector(reward: np.ndarray, costs: np.ndarray, mask: np.ndarray, lam, n: int | None) -> np.ndarray:
    """(P, m) exact expected Best-of-n cost vector per prompt at the vector ``lam``."""
    return expected_at(reward, costs, mask, lam, n, *columns(costs)).T


def clip_each(costs: np.ndarray, bounds) -> np.ndarray:
    """(P, K, m) costs clipped to ``bounds``: a (m, 2) array, or one [lo, hi] pair for every cost."""
    b = np.broadcast_to(np.asarray(bounds, dtype=float), (costs.shape[2], 2))
    return np.stack([np.clip(c, lo, hi) for c, (lo, hi) in zip(columns(costs), b, strict=True)], axis=2)


def slack(tau: np.ndarray) -> np.ndarray:
    """The scalar calibration's rounding slack: a mean cost at tau + slack meets tau."""
    return 1e-12 * np.maximum(1.0, np.abs(tau))


def meets(mean: np.ndarray, tau) -> np.ndarray:
    """Whether each row of mean cost vectors is at or below tau in every coordinate (within :func:`slack`)."""
    tau = np.asarray(tau, dtype=float)
    return np.all(mean <= tau + slack(tau), axis=-1)


@dataclass(frozen=True)
class RayPath:
    """The mean expected cost vector along lam = s d: ``mean[t]`` holds on [s[t], s[t + 1]) (s[0] = 0)."""

    direction: np.ndarray
    s: np.ndarray  # (T + 1,) breakpoints, s[0] = 0
    mean: np.ndarray  # (T + 1, m)


def prompt_crossings(reward_i: np.ndarray, cost_i: np.ndarray, mask_i: np.ndarray, s_max: float) -> np.ndarray:
    """The sorted distinct s in (0, s_max] where two of the prompt's samples' combined scores cross."""
    a, b = np.triu_indices(len(reward_i), 1)
    live = mask_i[a] & mask_i[b] & (cost_i[a] != cost_i[b])
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (reward_i[a] - reward_i[b]) / (cost_i[a] - cost_i[b])
    cross = cross[live & (cross > 0) & (cross <= s_max)]
    return np.unique(cross)


def prompt_values(reward: np.ndarray, costs: np.ndarray, mask: np.ndarray, direction, n: int | None,
                  s_max: float) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per prompt along lam = s d on [0, s_max]: its crossings (:func:`prompt_crossings`) and its expected cost
    vector (L, m) at s = 0 and at each of them, every prompt's every s ranked in one batch (each row as
    :func:`lara.calibrate.bestofn.expected` ranks it alone)."""
    c = combined(costs, np.asarray(direction, dtype=float))
    pts = [prompt_crossings(reward[i], c[i], mask[i], s_max) for i in range(len(reward))]
    lams = [np.concatenate([[0.0], p]) for p in pts]
    of = np.repeat(np.arange(len(reward)), [len(lam) for lam in lams])
    v = expected_rows(reward[of], c[of], mask[of], np.concatenate(lams), n, *columns(costs[of]))
    cut = np.cumsum([len(lam) for lam in lams])[:-1]
    return [(p, vi.T) for p, vi in zip(pts, np.split(v, cut, axis=1), strict=True)]


def ray_path(reward: np.ndarray, costs: np.ndarray, mask: np.ndarray, direction, n: int | None, s_max: float,
             per_prompt: list | None = None) -> RayPath:
    """Every change of the mean expected cost vector along lam = s d on [0, s_max], exactly: each
    prompt's vector evaluated at s = 0 and at every one of its crossings (the value at a crossing is the value
    just after it: ties go to the lower combined cost), its changes merged across prompts. ``per_prompt``: the
    prompts' :func:`prompt_values` along this ray, when already computed."""
    d = np.asarray(direction, dtype=float)
    values = prompt_values(reward, costs, mask, d, n, s_max) if per_prompt is None else per_prompt
    return _merged(values, np.full(len(reward), 1.0 / len(reward)), d, costs.shape[2])


def _merged(values: list, w: np.ndarray, d: np.ndarray, m: int) -> RayPath:
    """The path of the prompts' ``values`` (:func:`prompt_values`) under the prompt weights ``w`` (summing to 1)."""
    start = np.zeros(m)
    where, change = [], []
    for i, (pts, v) in enumerate(values):
        start += w[i] * v[0]
        diff = np.diff(v, axis=0) * w[i]
        moved = np.abs(diff).max(axis=1, initial=0.0) > TIE_RTOL * max(1.0, float(np.abs(v).max())) * w[i]
        where.append(pts[moved])
        change.append(diff[moved])
    s = np.concatenate(where) if where else np.empty(0)
    delta = np.concatenate(change) if change else np.empty((0, m))
    order = np.argsort(s, kind="stable")
    s, delta = s[order], delta[order]
    # changes at one s from several prompts are one breakpoint
    uniq, first = np.unique(s, return_index=True)
    summed = np.add.reduceat(delta, first, axis=0) if len(s) else np.empty((0, m))
    mean = np.vstack([start, start + np.cumsum(summed, axis=0)])
    return RayPath(d, np.concatenate([[0.0], uniq]), mean)


def first_feasible(path: RayPath, tau) -> tuple[float | None, int]:
    """The smallest s on the path whose mean cost vector is <= tau in every coordinate (with the scalar
    calibration's rounding slack), and its index; (None, -1) when no s up to the path's end is."""
    ok = meets(path.mean, tau)
    if not ok.any():
        return None, -1
    t = int(np.argmax(ok))
    return float(path.s[t]), t


def soft_dual(reward: np.ndarray, costs: np.ndarray, mask: np.ndarray, tau, beta: float, lam_max: float
              ) -> tuple[np.ndarray, dict]:
    """The minimiser of the convex soft dual g over [0, lam_max]^m (L-BFGS-B with g's exact gradient) and a
    record of the solve (value, gradient, iterations, whether it converged)."""
    from scipy.optimize import minimize
    from scipy.special import logsumexp

    tau = np.asarray(tau, dtype=float)
    w = np.full(len(reward), 1.0 / len(reward))  # the prompts' mean as a weighted sum
    counts = mask.sum(axis=1)

    def value_and_grad(lam):
        z = np.where(mask, (reward - combined(costs, lam)) / beta, -np.inf)
        lse = logsumexp(z, axis=1)
        g = beta * float(w @ (lse - np.log(counts))) + float(lam @ tau)
        tilt = np.exp(z - lse[:, None])  # (P, K) the Gibbs tilt of each prompt's samples
        mean_c = np.einsum("pk,pkm->pm", tilt, np.where(mask[..., None], costs, 0.0))
        return g, tau - w @ mean_c

    m = costs.shape[2]
    res = minimize(value_and_grad, np.zeros(m), jac=True, method="L-BFGS-B", bounds=[(0.0, lam_max)] * m,
                   options={"gtol": 1e-10, "ftol": 1e-14, "maxiter": 1000})
    _, grad = value_and_grad(res.x)
    return res.x, {"value": float(res.fun), "gradient": grad.tolist(), "iterations": int(res.nit),
                   "converged": bool(res.success), "message": str(res.message)}


def bon_along_soft_direction(reward, costs, mask, tau, n: int | None, beta: float, lam_max: float) -> dict:
    """Best-of-n's vector lambda: the direction of the soft dual's minimiser (all ones if it is zero: no
    constraint binds the tilt), then the smallest s along it whose exact expected Best-of-n cost vector meets
    every tau (None when none up to lam_max does); ``prompt_values``: the prompts' :func:`prompt_values` along the
    ray (for a bootstrap along it)."""
    lam_soft, solve = soft_dual(reward, costs, mask, tau, beta, lam_max)
    norm = float(lam_soft.max())
    direction = lam_soft / norm if norm > 0 else np.ones(costs.shape[2])
    values = prompt_values(reward, costs, mask, direction, n, lam_max)
    path = ray_path(reward, costs, mask, direction, n, lam_max, per_prompt=values)
    s, t = first_feasible(path, tau)
    lam = None if s is None else s * direction
    return {"lambda": None if lam is None else lam.tolist(), "direction": direction.tolist(), "s": s,
            "mean_cost": None if s is None else path.mean[t].tolist(), "soft": lam_soft.tolist(), "solve": solve,
            "prompt_values": values}


def ltt_along(reward, costs, mask, direction, tau, n: int | None, grid, delta: float, bounds,
              p_values: str = "hb", seed: int = 0) -> dict:
    """Learn then Test for every constraint at once along a fixed ray: for each s of ``grid`` (fixed before the
    data, tested from the largest down) the null "some E[c_j(s d)] > tau_j" is an intersection-union null, so
    its p-value is the largest of the constraints' p-values of their clipped losses (costs clipped to ``bounds``: a
    (m, 2) array or one pair for all) — ``p_values`` "hb": Hoeffding-Bentkus of the mean
    (:func:`lara.calibrate.certify.hb_p_value`), "wsr": the betting test of the prompts' losses in one seeded order
    (:func:`lara.calibrate.betting.betting_p_values`); fixed-sequence testing stops at the first s not rejected at
    ``delta`` and returns the last rejected one. With probability >= 1 - delta over the prompts, every constraint
    holds in expectation at that lambda, provided ``direction`` and ``grid`` did not depend on these prompts."""
    from lara.calibrate.betting import betting_p_values, prompt_order
    from lara.calibrate.certify import hb_p_value

    if p_values not in ("hb", "wsr"):
        raise ValueError(f"p_values {p_values!r}: hb or wsr")
    tau = np.asarray(tau, dtype=float)
    m = costs.shape[2]
    b = np.broadcast_to(np.asarray(bounds, dtype=float), (m, 2))
    clipped = clip_each(costs, b)
    d = np.asarray(direction, dtype=float)
    order = prompt_order(len(reward), seed)
    chosen, p_at, mean_at = None, None, None
    for block, v in _along_grid(reward, costs, clipped, mask, d, n, sorted(np.asarray(grid, dtype=float))[::-1]):
        if p_values == "hb":  # (m, B) every constraint's p-value at each s of the block (each row's own mean, as
            # one s at a time took it: the same sum, so the same p-value to the bit)
            p = np.array([hb_p_value(np.array([v[j, t].mean() for t in range(len(block))]), len(reward), tau[j], b[j])
                          for j in range(m)])
        else:
            p = np.array([betting_p_values(v[j], tau[j], delta, b[j], order) for j in range(m)])
        worst = p.max(axis=0)
        stop = int(np.argmax(worst > delta)) if (worst > delta).any() else len(block)
        if stop:
            chosen, p_at, mean_at = float(block[stop - 1]), float(worst[stop - 1]), v[:, stop - 1].mean(axis=1).tolist()
        if stop < len(block):
            break
    # (mean_at: the tested prompts' own mean clipped cost at the certified lambda, what the certificate is about;
    # never above tau where certified)
    return {"s": chosen, "lambda": None if chosen is None else (chosen * d).tolist(), "p_value": p_at,
            "delta": delta, "p_values": p_values, "tested_mean_cost": mean_at}


def _along_grid(reward, costs, clipped, mask, d, n: int | None, grid, first: int = 32):
    """Yield (block, v) down ``grid``, a block of grid points at a time (blocks doubling from ``first``, so a
    search that stops early ranks little beyond its stop): v (m, B, P) the clipped costs' expectation at the
    Best-of-n choice at each lam = s d of the block, what ``expected`` gives there."""
    p_count, m = len(reward), costs.shape[2]
    at, size = 0, first
    while at < len(grid):
        block = grid[at:at + size]
        c = np.concatenate([combined(costs, s * d) for s in block])
        tile = np.tile(np.arange(p_count), len(block))
        v = expected_rows(reward[tile], c, mask[tile], np.ones(len(c)), n, *columns(clipped[tile]))
        yield block, v.reshape(m, len(block), p_count)
        at, size = at + size, 2 * size


def bootstrap_along(reward, costs, mask, direction, tau, n: int | None, s_max: float, replicates: int, seed: int,
                    quantile: float, per_prompt: list | None = None) -> dict:
    """The bootstrap over prompts of the first s along a fixed ray whose mean expected Best-of-n cost vector meets
    every tau, and its ``quantile`` (the vector analogue of the scalar lambda*: a heuristic upper confidence bound
    on the s that meets every constraint, no finite-sample guarantee; replicates that meet no tau up to s_max count
    as s_max). Each replicate re-weights the prompts by multinomial counts on the exact path of every prompt."""
    d = np.asarray(direction, dtype=float)
    p_count = len(reward)
    values = prompt_values(reward, costs, mask, d, n, s_max) if per_prompt is None else per_prompt
    m = costs.shape[2]
    per_prompt = [_merged([one], np.ones(1), d, m) for one in values]  # each prompt's own path
    s_all = np.unique(np.concatenate([p.s for p in per_prompt]))
    # each prompt's vector on the common breakpoints (its own path is piecewise constant between its own ones)
    at = np.stack([p.mean[np.searchsorted(p.s, s_all, side="right") - 1] for p in per_prompt])  # (P, S, m)
    rng = np.random.default_rng(seed)
    out = np.empty(replicates)
    uniform = np.full(p_count, 1.0 / p_count)
    for b in range(replicates):
        w = rng.multinomial(p_count, uniform) / p_count
        ok = meets(np.einsum("p,psm->sm", w, at), tau)
        out[b] = s_all[np.argmax(ok)] if ok.any() else s_max
    s_q = float(np.quantile(out, quantile))
    return {"s": s_q, "lambda": (s_q * d).tolist(), "replicates": out, "quantile": quantile}


def pareto_ltt(reward, costs, mask, tau, n: int | None, beta: float, lam_max: float, grid, delta: float, bounds,
               seed: int, fraction: float = 0.5, p_values: tuple[str, ...] = ("hb",)) -> dict[str, dict]:
    """Pareto Testing for Best-of-n: split the prompts (seeded); on the first part choose the ray (the soft dual's
    direction, :func:`bon_along_soft_direction`); on the second, Learn then Test along it for every constraint at
    once (:func:`ltt_along`), once per kind of ``p_values`` (the same split and ray for each). The direction depends
    only on the first part, so each guarantee holds over the draw of the second: with probability >= 1 - delta every
    constraint holds in expectation at the returned lambda. Returns each kind's result."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(reward))
    cut = int(round(fraction * len(reward)))
    if not 0 < cut < len(reward):
        raise ValueError(f"a split of {len(reward)} prompts at {fraction} leaves one part empty")
    choose, test = order[:cut], order[cut:]
    chosen = bon_along_soft_direction(reward[choose], costs[choose], mask[choose], tau, n, beta, lam_max)
    split = {"direction": chosen["direction"], "n_choose": int(cut), "n_test": int(len(test))}
    return {kind: ltt_along(reward[test], costs[test], mask[test], chosen["direction"], tau, n, grid, delta, bounds,
                            kind, seed) | split for kind in p_values}
