"""Agreement of a scorer and a judge on the same items (lara.evaluate.agreement): Spearman's rho and top-decile
agreement with bootstrap intervals, and the inputs it refuses."""

import math

import numpy as np
import pytest
from scipy.stats import spearmanr

from lara.evaluate.agreement import (
    agreement,
    rank_correlation,
    replicate_indices,
    top_agreement,
    top_k,
    top_set,
)


def test_identical_scores_agree_fully_and_reversed_ones_not_at_all():
    x = np.random.default_rng(1).normal(size=200)
    same = agreement(x, x.copy(), n_boot=400, seed=0)
    assert same.n == 200 and same.top_k == 20 and same.degenerate == 0
    assert same.spearman == pytest.approx(1.0) and same.top_decile == pytest.approx(1.0)
    assert same.spearman_ci == pytest.approx((1.0, 1.0)) and same.top_decile_ci == pytest.approx((1.0, 1.0))
    rev = agreement(x, -x, n_boot=400, seed=0)
    assert rev.spearman == pytest.approx(-1.0) and rev.top_decile == 0.0
    assert rev.spearman_ci == pytest.approx((-1.0, -1.0)) and rev.top_decile_ci == (0.0, 0.0)
    # a monotone transform is the same order
    assert agreement(x, np.exp(x), n_boot=200, seed=3).spearman == pytest.approx(1.0)


def test_independent_scores_agree_about_as_chance_does():
    n = 2000
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=n), rng.uniform(size=n)
    a = agreement(x, y, n_boot=400, seed=1)
    se = 1 / math.sqrt(n - 1)  # Spearman's rho under independence: mean 0, standard deviation 1/sqrt(n-1)
    assert abs(a.spearman) < 4 * se
    width = a.spearman_ci[1] - a.spearman_ci[0]
    assert 0.5 * 2 * 1.96 * se < width < 2 * 2 * 1.96 * se
    assert a.spearman_ci[0] < a.spearman < a.spearman_ci[1]
    # top decile: the overlap of two independent k-subsets of n items is hypergeometric, mean k^2/n
    k = top_k(n)
    sd = math.sqrt(k * (k / n) * (1 - k / n) * (n - k) / (n - 1)) / k
    assert abs(a.top_decile - k / n) < 4 * sd
    assert a.top_decile_ci[0] <= a.top_decile <= a.top_decile_ci[1]


def test_the_replicates_are_spearman_and_the_top_overlap_of_each_resample():
    rng = np.random.default_rng(0)
    n = 40
    x = rng.integers(0, 8, size=n).astype(float)  # many ties
    y = x + rng.normal(size=n)
    idx = np.concatenate(list(replicate_indices(n, 50, seed=5)))
    assert idx.shape == (50, n)
    got = rank_correlation(x[idx], y[idx])
    want = [spearmanr(x[i], y[i]).statistic for i in idx]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
    # with distinct values the top-decile agreement is the plain overlap of the two top-k sets
    u, v = rng.permutation(100).astype(float), rng.permutation(100).astype(float)
    k = top_k(100)
    plain = len(set(np.argsort(-u)[:k]) & set(np.argsort(-v)[:k])) / k
    assert top_agreement(u, v, k) == pytest.approx(plain)


def test_ties_at_the_top_boundary_are_all_in_and_the_item_order_does_not_matter():
    values = np.array([5.0, 4.0, 3.0, 3.0, 3.0, 1.0, 0.0, 0.0, 0.0, 0.0])
    assert top_set(values, 3).tolist() == [True] * 5 + [False] * 5
    assert top_set(values, 2).tolist() == [True] * 2 + [False] * 8
    assert top_agreement(values, values[::-1].copy(), 3) == 0.0
    judge = np.array([5.0, 0.0, 3.0, 9.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0])  # its top 3: items 0, 2, 3
    assert top_agreement(values, judge, 3) == pytest.approx(3 / 5)
    rng = np.random.default_rng(2)
    x = rng.integers(0, 4, size=60).astype(float)
    y = rng.integers(0, 4, size=60).astype(float)
    base = agreement(x, y, n_boot=200, seed=0)
    order = rng.permutation(60)
    shuffled = agreement(x[order], y[order], n_boot=200, seed=0)
    assert shuffled.spearman == pytest.approx(base.spearman) and shuffled.top_decile == base.top_decile
    assert 0 <= base.top_decile <= 1
    tied = agreement(x, x.copy(), n_boot=200, seed=0)  # identical scores agree fully, however many ties
    assert tied.top_decile == 1.0 and tied.top_decile_ci == (1.0, 1.0)


def test_the_same_seed_gives_the_same_intervals():
    rng = np.random.default_rng(3)
    x = rng.normal(size=80)
    y = x + rng.normal(size=80)
    assert agreement(x, y, 300, 11) == agreement(list(x), list(y), 300, 11)
    assert agreement(x, y, 300, 11).to_dict()["spearman_ci"] == list(agreement(x, y, 300, 11).spearman_ci)


def test_resamples_with_a_constant_side_are_counted_and_too_many_refused():
    # one item of ten stands out: a resample misses it with probability 0.9^10, and then the scorer is constant
    x = np.array([0.0] * 9 + [1.0])
    y = np.arange(10.0)
    n_boot = 2000
    a = agreement(x, y, n_boot=n_boot, seed=0)
    p = 0.9 ** 10
    assert abs(a.degenerate - n_boot * p) < 5 * math.sqrt(n_boot * p * (1 - p))
    # with 250 resamples about 163 are defined, fewer than the 200 a 95 % interval needs
    with pytest.raises(ValueError, match=r"of 250 resamples have a constant side .*use at least 200"):
        agreement(x, y, n_boot=250, seed=0)


@pytest.mark.parametrize("x, y, message", [
    (np.r_[np.arange(11.0), np.nan], np.arange(12.0), r"the scorer's scores hold 1 non-finite values \(first at item "
                                                      r"11\)"),
    (np.arange(12.0), np.r_[np.inf, np.arange(11.0)], "the judge's scores hold 1 non-finite values"),
    (np.arange(12.0), np.arange(11.0), "12 scorer scores but 11 judge scores"),
    (np.arange(9.0), np.arange(9.0), "9 items; agreement needs at least 10"),
    (np.ones(12), np.arange(12.0), r"the scorer's scores are constant .*the rank correlation is undefined"),
    (np.arange(12.0), np.full(12, 0.5), "the judge's scores are constant"),
    (np.ones((12, 2)), np.ones((12, 2)), r"not one score per item \(shape \(12, 2\)\)"),
    (np.array(["a"] * 12), np.arange(12.0), "not real numbers"),
])
def test_unfit_scores_are_refused_naming_the_problem(x, y, message):
    with pytest.raises(ValueError, match=message):
        agreement(x, y, n_boot=200, seed=0)


def test_too_few_replicates_are_refused():
    with pytest.raises(ValueError, match=r"n_boot: 100 replicates .* use at least 200"):
        agreement(np.arange(20.0), np.arange(20.0), n_boot=100, seed=0)
