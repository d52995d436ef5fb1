"""The betting test (lara.calibrate.betting, issue 48 groundwork): its level on losses whose mean is tau, its power
where Hoeffding-Bentkus gives most away (losses with little spread), and its Learn-then-Test lambda against brute
force: every N-subset of every prompt enumerated at every stretch of constant losses, tested in the same order."""

from __future__ import annotations

import numpy as np

from lara.calibrate.bestofn import steps
from lara.calibrate.betting import betting_ltt_lambda, betting_rejects, prompt_order
from lara.calibrate.certify import clip_costs, hb_p_value

from .test_certify import enumerated_losses, scores


def test_the_level_holds_on_the_null():
    """Losses whose mean is exactly tau (the null's boundary), 2,000 calibration draws: rejected at most delta of
    the time (plus three binomial standard errors)."""
    rng = np.random.default_rng(0)
    delta, n, reps = 0.1, 100, 2000
    for spread in (0.5, 0.05):  # a wide and a narrow loss distribution, both with mean 0.5
        losses = np.clip(0.5 + spread * rng.uniform(-1, 1, size=(reps, n)), 0, 1)
        losses += 0.5 - losses.mean()  # the population mean is 0.5 up to the draw's own noise: shift it exactly
        rate = betting_rejects(losses, 0.5, delta, (0.0, 1.0), prompt_order(n, 1)).mean()
        assert rate <= delta + 3 * np.sqrt(delta * (1 - delta) / reps), (spread, rate)


def test_it_certifies_where_hoeffding_bentkus_cannot():
    """Losses tightly around 0.42 against tau = 0.5 with 50 prompts: Hoeffding-Bentkus's p-value (worst-case
    variance) stays above delta, the betting test rejects; losses spread over [0, 1] with the same mean: the
    betting test is not more eager than the variance allows (HB and it both refuse)."""
    rng = np.random.default_rng(3)
    tight = 0.42 + 0.02 * rng.uniform(-1, 1, size=50)
    assert float(hb_p_value(tight.mean(), 50, 0.5, (0.0, 1.0))) > 0.1
    assert betting_rejects(tight, 0.5, 0.1, (0.0, 1.0), prompt_order(50, 0))
    wide = rng.binomial(1, 0.42, size=50).astype(float)
    assert not betting_rejects(wide, 0.5, 0.1, (0.0, 1.0), prompt_order(50, 0))


def test_the_ltt_lambda_is_the_fixed_sequence_over_every_stretch():
    s = scores(seed=5, prompts=30, k=6)
    n, bounds, lam_max, delta, seed = 3, (-3.0, 3.0), 5.0, 0.1, 7
    clip, _ = clip_costs(s.cost, s.mask, bounds)
    st = steps(s.reward, s.cost, s.mask, n, lam_max, value=clip)
    mean_end = float(st.end.mean())
    tau = mean_end + 0.7 * (float(st.start.mean()) - mean_end)  # certifiable with 30 prompts, not at lambda = 0
    lam, feasible = betting_ltt_lambda(st, tau, delta, lam_max, bounds, seed, block=4)
    # brute force: the stretches' left ends from the top, each stretch's losses by enumerating the 3-subsets at a
    # lambda inside it, tested in the same order; the certified lambda is the last left end of the rejected run
    crossings = np.unique(st.lam)
    left = np.concatenate([[0.0], crossings])[::-1]
    right = np.concatenate([crossings, [lam_max]])[::-1]
    inside = 0.5 * (left + right)
    losses = enumerated_losses(s, n, inside, bounds).T  # (stretches, prompts)
    rejected = betting_rejects(losses, tau, delta, bounds, prompt_order(s.n_prompts, seed))
    assert rejected[0] and feasible
    run = int(np.argmin(rejected)) if not rejected.all() else len(rejected)
    assert np.isclose(lam, left[run - 1]), (lam, left[run - 1])
    assert 0 < lam < lam_max and 10 < run < len(left)  # it walked many stretches (several blocks) and stopped
    # the certified lambda meets tau on these prompts' own losses (a certificate is never below the mean)
    at = enumerated_losses(s, n, [lam + 1e-9], bounds).mean()
    assert at <= tau + 1e-12
    # not reachable at all: lambda_max, not feasible
    assert betting_ltt_lambda(st, mean_end - 10.0, delta, lam_max, bounds, seed) == (lam_max, False)


def test_a_mean_above_tau_is_never_certified_however_the_wealth_ran():
    """Small losses first in the test's order run the wealth past 1 / delta early; the mean of all of them is above
    tau all the same: not rejected (a certificate is never below its own mean)."""
    n = 100
    order = prompt_order(n, 0)
    losses = np.empty(n)
    losses[order[:15]] = 0.0  # the first 15 tested: no loss at all
    losses[order[15:]] = 0.83  # the rest: well above tau
    assert losses.mean() > 0.5
    assert not betting_rejects(losses, 0.5, 0.1, (0.0, 1.0), order)
    from lara.calibrate.betting import betting_p_values, wealth_path

    x = losses[order]
    assert wealth_path(x, 0.5, 0.1).max() >= 10  # the wealth did run past 1 / delta
    assert betting_p_values(losses, 0.5, 0.1, (0.0, 1.0), order) == 1.0
