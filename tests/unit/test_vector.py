"""A vector lambda for Best-of-N (lara.calibrate.vector): the expected cost vector against enumeration of every
N-subset, the exact path along a ray against dense evaluation, the soft dual against a brute-force 2-D grid and
its KKT conditions, and Learn then Test for both constraints at once."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lara.calibrate.vector import (
    bon_along_soft_direction,
    combined,
    expected_vector,
    first_feasible,
    ltt_along,
    ray_path,
    soft_dual,
)


def world(seed: int, prompts: int = 40, k: int = 6, m: int = 2):
    """Rewards that rise with both costs (the conflict), the two costs partly independent."""
    rng = np.random.default_rng(seed)
    costs = rng.normal(0.0, 1.0, (prompts, k, m))
    reward = costs.sum(axis=2) * 0.6 + rng.normal(0.0, 0.5, (prompts, k))
    return reward, costs, np.ones((prompts, k), dtype=bool)


def brute_expected(reward, costs, lam, n):
    """The Best-of-n expected cost vector by enumerating every n-subset (argmax of r - lam.c, ties to the lower
    combined cost, then the lower index)."""
    c = combined(costs, lam)
    out = np.zeros((len(reward), costs.shape[2]))
    for i in range(len(reward)):
        subsets = list(itertools.combinations(range(reward.shape[1]), n))
        for sub in subsets:
            best = min(sub, key=lambda j: (-(reward[i, j] - c[i, j]), c[i, j], j))
            out[i] += costs[i, best] / len(subsets)
    return out


@pytest.mark.parametrize("n", [1, 3, 6])
def test_the_expected_cost_vector_is_the_average_over_every_subset(n):
    reward, costs, mask = world(0, prompts=8)
    for lam in ([0.0, 0.0], [0.7, 0.1], [0.2, 1.5]):
        np.testing.assert_allclose(expected_vector(reward, costs, mask, lam, n), brute_expected(reward, costs, lam, n),
                                   atol=1e-12)


@pytest.mark.parametrize("n", [3, 6])  # 6 = K: Best-of-all, the pick itself
def test_the_ray_path_is_exact_between_and_at_its_breakpoints(n):
    reward, costs, mask = world(1)
    d = np.array([1.0, 0.4])
    path = ray_path(reward, costs, mask, d, n, 4.0)
    assert path.s[0] == 0.0 and np.all(np.diff(path.s) > 0)
    probes = np.concatenate([path.s[:-1] + 0.5 * np.diff(path.s), path.s, [path.s[-1] + 0.01]])
    probes = probes[probes <= 4.0]
    for s in probes:
        t = np.searchsorted(path.s, s, side="right") - 1
        np.testing.assert_allclose(path.mean[t], expected_vector(reward, costs, mask, s * d, n).mean(axis=0),
                                   atol=1e-12)
    # a single constraint's mean is not monotone along the ray (why the whole path is scanned), the combined is
    assert np.any(np.diff(path.mean[:, 1]) > 1e-9)
    assert np.all(np.diff(path.mean @ d) <= 1e-12)


def test_first_feasible_is_the_smallest_s_meeting_every_tau():
    reward, costs, mask = world(2)
    d = np.array([1.0, 1.0])
    path = ray_path(reward, costs, mask, d, 3, 5.0)
    tau = path.mean[0] - np.array([0.4, 0.2])  # both constraints bind at s = 0
    s, t = first_feasible(path, tau)
    assert s is not None and s > 0
    assert np.all(expected_vector(reward, costs, mask, s * d, 3).mean(axis=0) <= tau + 1e-12)
    before = 0.5 * (path.s[t - 1] + s)
    assert np.any(expected_vector(reward, costs, mask, before * d, 3).mean(axis=0) > tau)
    dense = np.linspace(0.0, 5.0, 2001)
    means = np.array([expected_vector(reward, costs, mask, x * d, 3).mean(axis=0) for x in dense])
    ok = np.all(means <= tau + 1e-12, axis=1)
    assert dense[np.argmax(ok)] >= s - 1e-12  # no grid point before s meets both
    assert first_feasible(path, [-10.0, -10.0]) == (None, -1)


def test_the_soft_dual_minimises_g_on_a_brute_force_grid_and_meets_kkt():
    reward, costs, mask = world(3)
    beta = 0.5
    mean0 = costs.mean(axis=(0, 1))
    tau = mean0 - np.array([0.3, 0.1])
    lam, solve = soft_dual(reward, costs, mask, tau, beta, 10.0)
    assert solve["converged"]

    def g(lam_):
        z = (reward - combined(costs, lam_)) / beta
        top = z.max(axis=1, keepdims=True)
        return beta * np.mean(np.log(np.mean(np.exp(z - top), axis=1)) + top[:, 0]) + lam_ @ tau

    grid = np.linspace(0.0, 3.0, 121)
    best = min(g(np.array([a, b])) for a in grid for b in grid)
    assert g(lam) <= best + 1e-9
    grad = np.array(solve["gradient"])  # tau - E_tilt[c]: ~0 where lam_j > 0, >= 0 where lam_j = 0
    for j in range(2):
        assert abs(grad[j]) < 1e-6 if lam[j] > 1e-8 else grad[j] >= -1e-6
    eps = 1e-6
    inner = lam + 0.05  # the returned gradient is g's: against central differences at another point
    _, at_inner = soft_dual(reward, costs, mask, tau, beta, 10.0)
    fd = np.array([(g(inner + eps * np.eye(2)[j]) - g(inner - eps * np.eye(2)[j])) / (2 * eps) for j in range(2)])
    z = (reward - combined(costs, inner)) / beta
    tilt = np.exp(z - z.max(axis=1, keepdims=True))
    tilt /= tilt.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(fd, tau - np.einsum("pk,pkm->m", tilt, costs) / len(reward), atol=1e-6)
    assert at_inner["converged"]


def test_best_of_n_along_the_soft_direction_meets_both_constraints_and_is_minimal_on_its_ray():
    reward, costs, mask = world(4, prompts=60)
    n = 4
    zero = expected_vector(reward, costs, mask, [0.0, 0.0], n).mean(axis=0)
    tau = zero - np.array([0.5, 0.3])
    got = bon_along_soft_direction(reward, costs, mask, tau, n, beta=0.5, lam_max=20.0)
    lam = np.array(got["lambda"])
    assert np.all(expected_vector(reward, costs, mask, lam, n).mean(axis=0) <= tau + 1e-12)
    assert max(got["direction"]) == 1.0 and got["s"] > 0
    for shrink in (0.5, 0.9, 0.99):  # any smaller s on the same ray misses a constraint
        assert np.any(expected_vector(reward, costs, mask, shrink * lam, n).mean(axis=0) > tau + 1e-12)
    # the soft dual's own lambda is for the Gibbs tilt, not for argmax Best-of-N: where it lands is reported
    assert len(got["soft"]) == 2 and got["solve"]["converged"]


@pytest.mark.parametrize("kind", ["hb", "wsr"])
def test_ltt_for_both_constraints_holds_its_level_over_repeated_draws(kind):
    """A population of prompts; many calibration draws of 100; the LTT lambda along a fixed ray (chosen before
    any draw), with either kind of p-value, misses a constraint on the population in at most delta of them (plus
    binomial slack)."""
    from lara.calibrate.bestofn import expected

    reward, costs, mask = world(5, prompts=3000, k=6)
    n, delta, bounds = 3, 0.2, [-3.0, 3.0]
    clipped = [np.clip(costs[..., j], *bounds) for j in range(2)]
    d = np.array([1.0, 0.5])
    pop = expected_vector(reward, costs, mask, [0.0, 0.0], n).mean(axis=0)
    tau = pop - np.array([0.35, 0.15])
    grid = np.geomspace(0.01, 20.0, 60)
    rng = np.random.default_rng(0)
    misses, draws, chosen = 0, 60, []
    for _ in range(draws):
        idx = rng.choice(len(reward), 100, replace=False)
        got = ltt_along(reward[idx], costs[idx], mask[idx], d, tau, n, grid, delta, bounds, kind, len(chosen))
        assert got["s"] is not None and got["p_value"] <= delta
        # the guarantee is about the clipped costs' expectation on the population
        at = expected(reward, combined(costs, got["lambda"]), mask, [1.0], n, *clipped)[:, :, 0].mean(axis=1)
        misses += bool(np.any(at > tau))
        chosen.append(got["s"])
    assert len(set(chosen)) > 1  # the draws decide the lambda: not a constant end of the grid
    assert misses <= draws * delta + 3 * math.sqrt(draws * delta * (1 - delta))


def test_the_bootstrap_along_a_ray_matches_the_path_on_the_full_sample_and_bounds_it_from_above():
    from lara.calibrate.vector import bootstrap_along

    reward, costs, mask = world(6, prompts=50)
    d, n = np.array([1.0, 0.6]), 3
    zero = expected_vector(reward, costs, mask, [0.0, 0.0], n).mean(axis=0)
    tau = zero - np.array([0.4, 0.1])
    s_hat, _ = first_feasible(ray_path(reward, costs, mask, d, n, 10.0), tau)
    boot = bootstrap_along(reward, costs, mask, d, tau, n, 10.0, 400, 0, 0.9)
    reps = boot["replicates"]
    # the replicates scatter around the full sample's s-hat, and the deployed quantile lies above their median
    assert np.quantile(reps, 0.1) <= s_hat <= np.quantile(reps, 0.9) and boot["s"] >= np.median(reps)
    # each replicate's s meets its own weighted constraints (the same seeded draws, checked with expected_vector)
    rng = np.random.default_rng(0)
    for b in range(5):
        w = rng.multinomial(len(reward), np.full(len(reward), 1.0 / len(reward))) / len(reward)
        assert np.all(w @ expected_vector(reward, costs, mask, reps[b] * d, n) <= tau + 1e-9) or reps[b] == 10.0


def test_pareto_testing_chooses_the_ray_on_one_half_and_tests_on_the_other():
    from lara.calibrate.vector import pareto_ltt

    reward, costs, mask = world(7, prompts=400)
    n = 3
    zero = expected_vector(reward, costs, mask, [0.0, 0.0], n).mean(axis=0)
    tau = zero - np.array([0.6, 0.4])
    both = pareto_ltt(reward, costs, mask, tau, n, 0.5, 20.0, np.geomspace(0.01, 20.0, 80), 0.1, [-3.0, 3.0], 0,
                      p_values=("hb", "wsr"))
    got = both["hb"]
    assert got["n_choose"] == 200 and got["n_test"] == 200 and max(got["direction"]) == 1.0
    assert got["s"] is not None and got["p_value"] <= 0.1
    assert both["wsr"]["direction"] == got["direction"] and both["wsr"]["p_value"] <= 0.1  # one split, one ray
    # the same split tested by hand gives the same lambda, for either kind of p-value
    order = np.random.default_rng(0).permutation(400)
    test = order[200:]
    for kind in ("hb", "wsr"):
        again = ltt_along(reward[test], costs[test], mask[test], got["direction"], tau, n,
                          np.geomspace(0.01, 20.0, 80), 0.1, [-3.0, 3.0], kind, 0)
        assert again["lambda"] == both[kind]["lambda"] and again["p_values"] == kind
    with pytest.raises(ValueError, match="one part empty"):
        pareto_ltt(reward[:1], costs[:1], mask[:1], tau, n, 0.5, 20.0, [1.0], 0.1, [-3.0, 3.0], 0)
