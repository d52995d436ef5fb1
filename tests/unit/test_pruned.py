"""Pruned Best-of-N (lara.calibrate.pruned): the vectorised decoder against a plain per-subset loop, the stable
root on non-monotone curves, and the certificates' promises on a population whose cost is not monotone in lambda."""

from __future__ import annotations

import math

import numpy as np
import pytest

from lara.calibrate import procedures as proc
from lara.calibrate import pruned as pr
from lara.calibrate.decoder import Curves


def world(p=25, k=7, j=2, seed=1, ties=True):
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(p, k))
    c = rng.normal(size=(p, k))
    length = rng.integers(2, 30, size=(p, k))
    prr = r[..., None] + rng.normal(size=(p, k, j))
    pc = c[..., None] + rng.normal(size=(p, k, j))
    if ties:  # a prompt whose prefixes all tie at the first checkpoint: the lower sample index goes on
        prr[0, :, 0] = 0.5
        pc[0, :, 0] = 0.25
    return pr.PrefixScores(r, c, length, prr, pc)


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.7, 4.0])
def test_curves_equal_every_subset_run_plainly(lam):
    ps = world()
    sched = pr.Schedule(4, (5, 12), (3, 2))
    cv = pr.curves(ps, sched, [lam], bounds=(-1.0, 1.0), max_subsets=10_000)
    assert cv.exact and cv.n_subsets == math.comb(7, 4)
    bf = pr.brute_force(ps, sched, lam, bounds=(-1.0, 1.0))
    np.testing.assert_allclose(cv.clipped[:, 0], bf["cost"], atol=1e-12)
    np.testing.assert_allclose(cv.reward[:, 0], bf["reward"], atol=1e-12)
    np.testing.assert_allclose(cv.tokens[:, 0], bf["tokens"], atol=1e-9)
    assert (cv.cost_se == 0).all()


def tied_world(p=30, k=7, seed=4):
    """Prefix scores on a coarse scale (as short prefixes are: a few distinct texts), so many keep cuts tie."""
    ps = world(p=p, k=k, seed=seed, ties=False)
    return pr.PrefixScores(ps.reward, ps.cost, ps.length, np.round(ps.prefix_reward), np.round(ps.prefix_cost))


@pytest.mark.parametrize("lam", [0.0, 1.0, 3.0])
def test_keeping_the_ties_at_a_cut_is_the_plain_rule_and_costs_tokens(lam):
    """ties: keep keeps every candidate whose prefix score and cost equal the last kept one's (written out plainly
    in brute_force); it generates more tokens on average than stopping them by index, and the tied cuts are
    counted."""
    ps = tied_world()
    by_index, kept = pr.Schedule(4, (5, 12), (3, 2)), pr.Schedule(4, (5, 12), (3, 2), "keep")
    for sched in (by_index, kept):
        cv = pr.curves(ps, sched, [lam], max_subsets=10_000)
        bf = pr.brute_force(ps, sched, lam)
        np.testing.assert_allclose(cv.cost[:, 0], bf["cost"], atol=1e-12)
        np.testing.assert_allclose(cv.tokens[:, 0], bf["tokens"], atol=1e-9)
    rows = pr.gather(ps, pr.subsets(7, 4, 10_000, 0)[0])
    a, b = (pr.run(rows.reward, rows.cost, rows.length, rows.prefix_reward, rows.prefix_cost, lam, s)
            for s in (by_index, kept))
    assert b.tokens.mean() > a.tokens.mean()  # (per row it may be fewer: a tied one kept can displace a longer one)
    assert (b.full_scored >= a.full_scored).all() and (a.full_scored == 2).all()
    assert 0 < a.tied_cuts.mean() <= 2 and b.tied_cuts.mean() > 0
    # a tied cut, counted by hand: the last kept and the first stopped at the first checkpoint share score and cost
    score = rows.prefix_reward[..., 0] - lam * rows.prefix_cost[..., 0]
    ranked = pr.order(rows.prefix_reward[..., 0], rows.prefix_cost[..., 0], lam)
    at = np.arange(len(ranked))
    first = (np.isclose(score[at, ranked[:, 2]], score[at, ranked[:, 3]], rtol=0, atol=1e-12)
             & (rows.prefix_cost[at, ranked[:, 2], 0] == rows.prefix_cost[at, ranked[:, 3], 0]))
    assert (a.tied_cuts >= first).all() and first.any()
    d = pr.PrunedBestOfN(ps, by_index, max_subsets=10_000)
    share = d.facts(lam)["ties"]
    assert share == {"rule": "index", "tied_cut_share_at_lambda_star": pytest.approx(a.tied_cuts.mean() / 2)}


def test_no_tie_no_difference():
    ps = world(ties=False)
    a, b = (pr.curves(ps, s, [0.0, 1.0], max_subsets=10_000) for s in (pr.Schedule(4, (5, 12), (3, 2)),
                                                                      pr.Schedule(4, (5, 12), (3, 2), "keep")))
    np.testing.assert_array_equal(a.cost, b.cost)
    np.testing.assert_array_equal(a.tokens, b.tokens)


def test_one_subset_when_k_equals_n_and_tokens_counted():
    ps = world(k=5)
    sched = pr.Schedule(5, (4,), (1,))
    o = pr.run(ps.reward, ps.cost, ps.length, ps.prefix_reward, ps.prefix_cost, 0.0, sched)
    # one survivor after 4 tokens: 4 stopped candidates cost min(length, 4), the survivor its whole length
    kept = np.argmax(ps.prefix_reward[..., 0], axis=1)
    assert (o.pick == kept).all()
    want = np.minimum(ps.length, 4).sum(axis=1) - np.minimum(ps.length[np.arange(25), kept], 4) \
        + ps.length[np.arange(25), kept]
    np.testing.assert_array_equal(o.tokens, want)
    assert (o.prefix_scored == 5).all() and (o.full_scored == 1).all()
    cv = pr.curves(ps, sched, [0.0])
    assert cv.exact and cv.n_subsets == 1
    np.testing.assert_allclose(cv.cost[:, 0], ps.cost[np.arange(25), kept])


def test_sampled_subsets_are_unbiased_within_their_error():
    ps = world(p=40, k=9, seed=3, ties=False)
    sched = pr.Schedule(4, (6,), (2,))
    exact = pr.curves(ps, sched, [0.5], bounds=(-2, 2), max_subsets=1000)
    drawn = pr.curves(ps, sched, [0.5], bounds=(-2, 2), max_subsets=60, seed=11)
    assert exact.exact and not drawn.exact and drawn.n_subsets == 60
    err = drawn.clipped[:, 0] - exact.clipped[:, 0]
    se = drawn.cost_se[:, 0]
    assert (se > 0).any()
    # the mean over prompts of the estimate is within 4 standard errors of the exact one
    assert abs(err.mean()) <= 4 * math.sqrt((se ** 2).sum()) / len(se) + 1e-12


def test_stable_root_takes_the_last_stretch():
    ok = np.array([[False, True, False, True, True],   # met at 1, broken at 2: from 3 on
                   [True, True, True, True, True],     # inactive
                   [True, True, True, True, False],    # the end misses: infeasible
                   [False, False, False, False, True]])
    idx, status = proc.stable_root(ok)
    assert idx.tolist() == [3, 0, 4, 4]
    assert status.tolist() == [0, 1, 2, 0]


def test_envelope_is_monotone_and_above():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(6, 30))
    e = proc.envelope(v)
    assert (e >= v).all()
    assert (np.diff(e, axis=1) <= 0).all()
    assert (e[:, -1] == v[:, -1]).all()


def test_schedule_refusals_name_the_problem():
    with pytest.raises(ValueError, match="below the 4 candidates alive"):
        pr.Schedule(20, (3, 10), (4, 5))
    with pytest.raises(ValueError, match="increasing"):
        pr.Schedule(20, (10, 3), (4, 2))
    with pytest.raises(ValueError, match="as many keep counts"):
        pr.Schedule(20, (3,), (4, 2))
    with pytest.raises(ValueError, match="neither a whole number"):
        pr.make_schedule(20, [3.5], [2], 48)
    s = pr.make_schedule(20, [0.1, 0.5], [0.2, 0.1], 48)
    assert s.checkpoints == (5, 24) and s.keep == (4, 2)


def bump_population(p=3000, seed=0):
    """Per prompt a 0/1 loss on a grid whose mean dips below tau, rises in a bump above it, and falls again (a pruned
    decoder stopping the safe candidate at some lambdas): its mean crosses tau three times."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 5, 51)
    base = 0.55 - 0.25 * np.minimum(grid, 1.2) / 1.2 + 0.3 * np.exp(-((grid - 2.5) / 0.4) ** 2) \
        - 0.2 * np.maximum(grid - 3.0, 0) / 2.0
    u = rng.random((p, 1))  # one uniform per prompt: its loss is 1 where the curve is above it
    return grid, (u < base[None]).astype(float)


def test_certificates_hold_where_the_cost_is_not_monotone():
    grid, pop = bump_population()
    tau, delta, bounds = 0.4, 0.1, (0.0, 1.0)
    mean = pop.mean(axis=0)
    bump = grid[np.argmax(mean)]
    assert (mean[grid < 2.0] < tau - 0.05).any() and mean.max() > tau + 0.1  # below tau, then above it again
    rng = np.random.default_rng(5)
    viol = {"ltt": 0, "ltt_wsr": 0}
    crc_costs, found = [], []
    reps, n = 300, 200
    for rep in range(reps):
        sub = pop[rng.integers(0, len(pop), size=n)]
        zero = np.zeros_like(sub)
        cv = Curves(grid, sub, sub, -sub, zero, zero, 1, True)
        for name, p in (("ltt", "hb"), ("ltt_wsr", "wsr")):
            s = proc.ltt(cv, tau, delta, bounds, p, seed=rep)
            viol[name] += bool(s.feasible and mean[s.index] > tau)
            found.append(s.lam(grid) if s.feasible else None)
        crc_costs.append(mean[proc.crc(cv, tau, bounds).index])
        # the stable root of lambda-hat never stops in the dip before the bump
        assert proc.hat(cv, tau).lam(grid) > bump
    assert viol["ltt"] / reps <= delta and viol["ltt_wsr"] / reps <= delta
    assert np.mean(crc_costs) <= tau
    assert all(lam > bump for lam in found if lam is not None) and any(lam is not None for lam in found)


def test_generating_with_the_stopping_done(tiny_world):
    """generate_pruned on a tiny random policy with the toy oracle as every scorer: the choice is the Best-of-N choice
    among the survivors, the tokens are every candidate's, a stopped candidate has at most its checkpoint's tokens,
    and a seeded generator repeats the run; schedule None is full Best-of-N with every candidate's scores."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.calibrate.bestofn import select
    from lara.decode.prune import generate_pruned
    from lara.scoring import load_scorer

    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    policy = AutoModelForCausalLM.from_pretrained(tiny_world["base"]).eval()
    scorers = {k: load_scorer("oracle", role="reward" if "reward" in k else "cost")
               for k in ("reward", "cost", "prefix_reward", "prefix_cost")}
    prompt = tiny_world["world"]["prompts"][0]["prompt"]
    sched = pr.Schedule(8, (3, 6), (4, 2))
    gen = {"temperature": 1.0, "top_k": 20, "max_new_tokens": 24}
    runs = [generate_pruned(policy, tok, prompt, 8, sched, 0.5, scorers, generator=torch.Generator().manual_seed(s),
                            **gen) for s in (1, 1, 2)]
    assert runs[0].response == runs[1].response and runs[0].tokens == runs[1].tokens
    full = generate_pruned(policy, tok, prompt, 8, None, 0.5, scorers, generator=torch.Generator().manual_seed(1),
                           **gen)
    assert len(full.extra["reward"]) == 8
    r, c = np.asarray(full.extra["reward"]), np.asarray(full.extra["cost"])
    assert full.reward == pytest.approx(r[select(r[None], c[None], 0.5)[0]])
    for run in runs:
        # 6 candidates stop at 3 tokens at most, 2 more at 6 at most, 2 run on: never more than full generation
        assert run.tokens <= 6 * 3 + 2 * 6 + 2 * gen["max_new_tokens"]
        assert run.scorer_calls == 2 * (8 + 4) + 2 * 2 or run.policy_steps <= 6
    assert np.mean([x.tokens for x in runs]) < full.tokens or full.policy_steps <= 3
    with pytest.raises(ValueError, match="schedule is for N = 8"):
        generate_pruned(policy, tok, prompt, 6, sched, 0.5, scorers, **gen)


def test_prefix_tables_and_settings_refused_where_a_wrong_answer_would_follow():
    """The hostile inputs that once passed: prefix scores that are NaN, infinite, booleans or text, lengths beyond
    max_new_tokens, reversed or equal cost bounds."""
    import pandas as pd

    from lara.calibrate.pruned import PruneSettings
    from lara.read.candidates import check_lengths, check_scores
    from lara.read.files import DataError
    from lara.settings import ConfigError

    df = pd.DataFrame({"prompt_id": ["a", "a"], "prefix_reward_2": [0.1, 0.2], "n_tokens": [3, 48]})
    check_scores(df, ["prefix_reward_2"], "t")
    check_lengths(df, 48, "t")
    for bad in ([np.nan, 0.2], [np.inf, 0.2], [True, False], ["0.1", "0.2"]):
        with pytest.raises(DataError, match="prefix_reward_2"):
            check_scores(df.assign(prefix_reward_2=bad), ["prefix_reward_2"], "t")
    for bad in ([0, 3], [3, 49], [2.5, 3], [np.nan, 3], [-1, 3]):
        with pytest.raises(DataError, match="n_tokens"):
            check_lengths(df.assign(n_tokens=bad), 48, "t")
    base = dict(n=20, max_new_tokens=48, tau=-0.5, lambda_search_max=5.0, bootstrap=200, quantile=0.975,
                guarantee="bootstrap", delta=0.1, checkpoints=[2, 3], keep=[6, 3])
    PruneSettings(**base, cost_bounds=[-8.0, 8.0])
    with pytest.raises(ConfigError, match="calibration.bootstrap: 100 replicates"):  # the floor every decoder has
        PruneSettings(**base | {"bootstrap": 100}, cost_bounds=[-8.0, 8.0])
    with pytest.raises(ConfigError, match="needs calibration.cost_bounds"):
        PruneSettings(**base | {"guarantee": "ltt"}, cost_bounds=None)
    for bounds in ([8.0, -8.0], [0.0, 0.0]):
        with pytest.raises(ConfigError, match="cost_bounds"):
            PruneSettings(**base, cost_bounds=bounds)
