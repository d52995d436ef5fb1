"""Certified lambdas (lara.calibrate.certify): CRC and Learn-then-Test checked against an independent
implementation (MAPIE 1.6.0's Hoeffding-Bentkus p-values, fixed-sequence testing and CRC bound), with every
prompt's expected Best-of-N cost found by enumerating its N-subsets; the settings' errors; lambda.json; and
the coverage study's promises on a synthetic population, where the truth is exact."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from lara.calibrate.bestofn import steps
from lara.calibrate.calibrate import CalibrationSettings, calibrate
from lara.calibrate.certify import certified_lambda, clip_costs, crc_threshold, hb_p_value, ltt_threshold
from lara.calibrate.coverage import CoverageSettings, study
from lara.calibrate.dual import PromptScores
from lara.config import ConfigError


def scores(seed: int, prompts: int, k: int) -> PromptScores:
    """Gaussian rewards and costs, correlated (the helpful answers are the costly ones), a prompt effect on cost."""
    rng = np.random.default_rng(seed)
    r = rng.normal(size=(prompts, k))
    c = 0.7 * r + 0.7 * rng.normal(size=(prompts, k)) + 0.8 * rng.normal(size=(prompts, 1))
    return PromptScores(r, c, np.ones((prompts, k), bool), np.arange(prompts))


def enumerated_losses(s: PromptScores, n: int, lams, bounds) -> np.ndarray:
    """(P, L) expected clipped Best-of-n cost by enumerating every n-subset of each prompt's samples and taking
    the argmax of r - lam c (evaluated between crossings, where there are no ties)."""
    clipped = np.clip(s.cost, *bounds)
    subsets = np.array(list(itertools.combinations(range(s.reward.shape[1]), n)))
    rows = np.arange(s.n_prompts)[:, None]
    out = np.zeros((s.n_prompts, len(lams)))
    for j, lam in enumerate(lams):
        score = (s.reward - lam * s.cost)[:, subsets]  # (P, subsets, n)
        win = subsets[np.arange(len(subsets)), score.argmax(axis=2)]  # (P, subsets) sample index
        out[:, j] = clipped[rows, win].mean(axis=1)
    return out


def candidates(s: PromptScores, lam_max: float) -> np.ndarray:
    """0 and every pairwise crossing in (0, lam_max]: where any prompt's loss can change."""
    k = s.reward.shape[1]
    a, b = np.triu_indices(k, 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (s.reward[:, a] - s.reward[:, b]) / (s.cost[:, a] - s.cost[:, b])
    cross = cross[np.isfinite(cross) & (cross > 0) & (cross <= lam_max)]
    return np.unique(np.concatenate([[0.0], cross]))


CASES = [  # prompts, K, N, tau, delta, bounds
    (150, 6, 3, -0.4, 0.1, (-3.0, 3.0)),
    (120, 5, 5, -0.2, 0.05, (-4.0, 4.0)),
    (200, 6, 2, -0.3, 0.2, (-2.5, 2.5)),
    (90, 5, 3, 0.3, 0.1, (-3.0, 3.0)),
]


@pytest.mark.parametrize("prompts,k,n,tau,delta,bounds", CASES)
def test_crc_and_ltt_agree_with_mapie_on_enumerated_losses(prompts, k, n, tau, delta, bounds):
    from mapie.risk_control import control_fwer
    from mapie.risk_control.methods import compute_hoeffding_bentkus_p_value, get_r_hat_plus

    lam_max = 5.0
    s = scores(prompts + k + n, prompts, k)
    grid = candidates(s, lam_max)
    # each candidate's loss holds up to the next candidate (right-continuous steps): evaluate in between
    mids = np.append((grid[:-1] + grid[1:]) / 2, grid[-1] + 1e-9)
    loss = enumerated_losses(s, n, mids, bounds)
    lo, hi = bounds
    risks = (loss - lo) / (hi - lo)  # MAPIE's losses live in [0, 1]
    alpha = (tau - lo) / (hi - lo)

    clip, _ = clip_costs(s.cost, s.mask, bounds)
    ours = steps(s.reward, s.cost, s.mask, n, lam_max, value=clip)
    np.testing.assert_allclose(ours.start, loss[:, 0], atol=1e-12)  # the exact curves are the enumerated ones

    # CRC: the smallest lambda whose upper bound n/(n+1) R + B/(n+1) is <= alpha
    _, r_plus = get_r_hat_plus(risks, grid, method="crc", bound=None, delta=None, sigma_init=None)
    ok = np.flatnonzero(r_plus <= alpha)
    crc = certified_lambda(ours, prompts, "crc", tau, lam_max, bounds, delta)
    assert crc.feasible == bool(len(ok))
    if len(ok):
        assert crc.lam == pytest.approx(grid[ok[0]], rel=1e-12, abs=1e-15)

    # LTT: Hoeffding-Bentkus p-values, fixed-sequence testing from the largest lambda down
    p = compute_hoeffding_bentkus_p_value(risks.mean(axis=0), prompts, alpha)[:, 0]
    rejected = control_fwer(p[::-1], delta, fwer_method="fixed_sequence")
    ltt = certified_lambda(ours, prompts, "ltt", tau, lam_max, bounds, delta)
    assert ltt.feasible == bool(len(rejected))
    if len(rejected):
        first = len(grid) - 1 - rejected.max()  # the smallest lambda of the unbroken run of rejections
        assert ltt.lam == pytest.approx(grid[first], rel=1e-12, abs=1e-15)
        np.testing.assert_allclose(hb_p_value(loss.mean(axis=0), prompts, tau, bounds), p, rtol=1e-9, atol=1e-15)
    print(f"\nP={prompts} K={k} N={n} tau={tau}: CRC {crc.lam:.6g}, LTT {ltt.lam:.6g} "
          f"({len(grid)} candidate lambdas)")


def test_the_thresholds_order_and_tighten_with_n():
    bounds, tau = (-3.0, 3.0), -0.5
    for n in (50, 200, 2000):
        crc, ltt = crc_threshold(tau, n, bounds), ltt_threshold(tau, n, 0.1, bounds)
        assert ltt < crc < tau  # LTT's confidence costs more than CRC's expectation
        assert hb_p_value(ltt, n, tau, bounds) <= 0.1 < hb_p_value(ltt + 1e-6, n, tau, bounds)
    assert crc_threshold(tau, 2000, bounds) > crc_threshold(tau, 50, bounds)
    assert ltt_threshold(tau, 2000, 0.1, bounds) > ltt_threshold(tau, 50, 0.1, bounds)
    assert ltt_threshold(tau, 3, 0.01, bounds) is None  # three prompts cannot certify anything at delta 0.01


def test_settings_refuse_a_guarantee_without_bounds_or_outside_bon_mode():
    with pytest.raises(ConfigError, match=r"calibration.guarantee: ltt needs calibration.cost_bounds"):
        CalibrationSettings(tau=-0.5, guarantee="ltt")
    with pytest.raises(ConfigError, match=r"calibration.cost_bounds: \[3.0, -3.0\] is not \[lo, hi\]"):
        CalibrationSettings(tau=-0.5, cost_bounds=[3.0, -3.0])
    with pytest.raises(ConfigError, match=r"calibration.cost_bounds"):
        CalibrationSettings(tau=-0.5, cost_bounds=[3.0])  # the schema's two items
    with pytest.raises(ConfigError, match=r"guarantee: crc is exact for Best-of-N only"):
        CalibrationSettings(tau=-0.5, guarantee="crc", cost_bounds=[-3.0, 3.0], mode="soft")


def test_the_deployed_procedure_is_lambda_star_and_its_promise_is_recorded(tmp_path):
    from lara.calibrate.record import read_lambda, resolve_lambda, write_lambda
    from lara.read.files import DataError

    s = scores(3, 400, 8)
    common = dict(tau=-0.4, cost_bounds=[-4.0, 4.0], bon_n=4, delta=0.1, bootstrap=300)
    out = {g: calibrate(s, CalibrationSettings(guarantee=g, **common))
           for g in ("bootstrap", "crc", "ltt", "ltt_wsr")}
    for g, rec in out.items():
        assert rec["lambda_star"] == rec["procedures"][g]["lambda"] and rec["guarantee"]["procedure"] == g
        assert set(rec["procedures"]) == {"bootstrap", "crc", "ltt", "ltt_wsr"}
        assert rec["procedures"] == out["bootstrap"]["procedures"]  # the procedure only picks what is deployed
    ltt = out["ltt"]
    assert "with probability >= 0.9 over the draw of the 400 calibration prompts, Best-of-4 at lambda" in \
        ltt["guarantee"]["statement"]
    assert ltt["procedures"]["ltt"]["p_value"] <= 0.1
    wsr = out["ltt_wsr"]  # the betting p-value at its own lambda, recomputed from the losses there: <= delta
    assert wsr["procedures"]["ltt_wsr"]["feasible"] and wsr["procedures"]["ltt_wsr"]["p_value"] <= 0.1
    assert "betting p-values" in wsr["guarantee"]["statement"] and wsr["guarantee"]["delta"] == 0.1
    assert wsr["procedures"]["ltt_wsr"]["clipped_mean_cost"] <= -0.4  # a certificate is never above its own mean
    assert ltt["procedures"]["ltt"]["clipped_mean_cost"] <= ltt_threshold(-0.4, 400, 0.1, (-4, 4)) + 1e-9
    assert ltt["decoder_cost_at_lambda_star"] <= -0.4  # the unclipped calibration cost meets tau too
    assert ltt["lambda_star"] > out["bootstrap"]["lambda_hat"]
    frac = ltt["guarantee"]["clipped_fraction"]
    assert frac["below"] == pytest.approx((s.cost < -4).mean()) and frac["above"] == pytest.approx((s.cost > 4).mean())

    path = tmp_path / "lambda.json"
    write_lambda(ltt, path)
    rec = read_lambda(path)
    assert resolve_lambda("ltt", 5.0, path) == ltt["procedures"]["ltt"]["lambda"] == rec.lambda_star
    assert resolve_lambda("crc", 5.0, path) == ltt["procedures"]["crc"]["lambda"]
    assert resolve_lambda("ltt_wsr", 5.0, path) == ltt["procedures"]["ltt_wsr"]["lambda"]
    edited = json.loads(path.read_text()) | {"lambda_star": ltt["procedures"]["bootstrap"]["lambda"]}
    path.write_text(json.dumps(edited))
    with pytest.raises(DataError, match=r"not the record's own ltt lambda"):
        read_lambda(path)
    bare = tmp_path / "bare.json"
    write_lambda(calibrate(s, CalibrationSettings(tau=-0.4, bon_n=4, bootstrap=300)), bare)
    with pytest.raises(DataError, match=r"no crc lambda .*calibration.cost_bounds"):
        resolve_lambda("crc", 5.0, bare)


def test_the_coverage_study_keeps_each_procedure_s_promise():
    """On a synthetic population of 1,500 prompts (its truth exact), LTT's violation rate stays within delta
    and CRC's mean clipped cost over draws within tau, up to the study's own sampling error."""
    pop = scores(11, 1500, 8)
    s = CoverageSettings(tau=0.0, quantile=0.9, delta=0.2, cost_bounds=[-3.0, 3.0], lambda_search_max=5.0,
                         bon_n=4, repeats=100, n_prompts=[100, 400], bootstrap=100, seed=0)
    result, draws = study(pop, s)
    by = {(r["procedure"], r["n"]): r for r in result["summary"]}
    assert set(by) == {(p, n) for p in ("bootstrap", "crc", "ltt", "ltt_wsr") for n in (100, 400)}
    for n in (100, 400):
        ltt, crc = by[("ltt", n)], by[("crc", n)]
        assert ltt["violation_lo"] <= 0.2  # the Clopper-Pearson interval reaches down to delta or below
        assert by[("ltt_wsr", n)]["violation_lo"] <= 0.2  # so does the betting test's
        sd = draws[(draws["procedure"] == "crc") & (draws["n"] == n)]["population_clipped_cost"].std()
        assert crc["mean_population_clipped_cost"] <= 0.0 + 3 * sd / np.sqrt(100)
        assert ltt["reward_given_up"] >= crc["reward_given_up"] - 1e-9  # confidence costs reward
        assert ltt["lambda_mean"] >= crc["lambda_mean"]
        assert (draws[draws["n"] == n]["violated"] == (draws[draws["n"] == n]["population_cost"] > 0.0)).all()
    # more prompts: tighter lambdas, less reward given up for the certified procedure
    assert by[("ltt", 400)]["reward_given_up"] < by[("ltt", 100)]["reward_given_up"]
    assert by[("ltt", 400)]["lambda_hi"] - by[("ltt", 400)]["lambda_lo"] < \
        by[("ltt", 100)]["lambda_hi"] - by[("ltt", 100)]["lambda_lo"]
    p = result["population"]
    assert p["n_prompts"] == 1500 and p["cost_at_lambda_pop"] <= 0.0 < p["cost_at_zero"]
    print("\n" + "\n".join(f"{r['procedure']:9s} n {r['n']:4d}: violation {r['violation_rate']:.2f} "
                           f"[{r['violation_lo']:.2f}, {r['violation_hi']:.2f}], reward given up "
                           f"{r['reward_given_up']:.3f}" for r in result["summary"]))


def test_planning_subsamples_k_and_refuses_k_below_n():
    pop = scores(5, 600, 8)
    s = CoverageSettings(tau=-0.4, quantile=0.9, delta=0.2, cost_bounds=[-4.0, 4.0], lambda_search_max=5.0,
                         bon_n=4, repeats=20, n_prompts=[100], samples_per_prompt=[4, 8], bootstrap=100, seed=0)
    result, draws = study(pop, s)
    assert sorted({r["k"] for r in result["summary"]}) == [4, 8]
    with pytest.raises(ValueError, match=r"samples_per_prompt \[2\]: each K must lie in \[decode.bon_n = 4"):
        study(pop, CoverageSettings(**{**s.__dict__, "samples_per_prompt": [2]}))
