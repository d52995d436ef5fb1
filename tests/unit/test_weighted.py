"""Covariate-shift weighted calibration (``lara calibrate --weights``): lambda-hat, the bootstrap, weighted CRC and
weighted LTT against a brute force that evaluates the weighted mean expected Best-of-N cost at every crossing;
equal weights give the plain calibration exactly; the weights file's checks and the uncertified record that
no decoder reads."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.bestofn import expected, roots, steps
from lara.calibrate.calibrate import CalibrationSettings, calibrate
from lara.calibrate.certify import effective_sample_size
from lara.calibrate.dual import PromptScores, bootstrap, resample_indices
from lara.calibrate.record import read_lambda
from lara.data.errors import DataError
from tests.conftest import lara_in_process

LAM_MAX = 20.0
BOUNDS = (-2.0, 2.0)


def shifted(seed: int, prompts: int = 150, k: int = 6):
    """Prompts whose cost level u_i varies, and weights exp(0.8 u_i) that favour the costly prompts (a deployment
    heavier in them), normalised to mean 1; some costs lie outside BOUNDS."""
    rng = np.random.default_rng(seed)
    u = rng.normal(size=prompts)
    r = rng.normal(size=(prompts, k))
    c = 0.8 * r + 0.6 * rng.normal(size=(prompts, k)) + 0.5 * u[:, None]
    w = np.exp(0.8 * u)
    return PromptScores(r, c, np.ones((prompts, k), bool), np.arange(prompts)), w / w.mean()


def crossings(s: PromptScores) -> np.ndarray:
    """0 and every pairwise crossing of r - lam c in (0, LAM_MAX]: the only lambdas where a loss can change."""
    a, b = np.triu_indices(s.reward.shape[1], 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cross = (s.reward[:, a] - s.reward[:, b]) / (s.cost[:, a] - s.cost[:, b])
    return np.unique(np.concatenate([[0.0], cross[np.isfinite(cross) & (cross > 0) & (cross <= LAM_MAX)]]))


def brute(s: PromptScores, w: np.ndarray, n: int, tau: float, delta: float):
    """lambda-hat, weighted CRC and weighted LTT straight from their definitions, on every crossing."""
    lams = crossings(s)
    cost = expected(s.reward, s.cost, s.mask, lams, n, s.cost)[0]  # (P, L)
    loss = expected(s.reward, s.cost, s.mask, lams, n, np.clip(s.cost, *BOUNDS))[0]
    p = w / w.sum()
    r_cost, r_loss = p @ cost, p @ loss
    hat = lams[np.argmax(r_cost <= tau + 1e-12)]
    # CRC: the test prompt enters with the largest calibration weight and the largest loss
    crc_value = (w @ loss + w.max() * BOUNDS[1]) / (w.sum() + w.max())
    crc = lams[np.argmax(crc_value <= tau + 1e-12)]
    # LTT: Hoeffding p-values at ESS, tested from LAM_MAX downwards, stopping at the first p > delta
    ess = w.sum() ** 2 / (w * w).sum()
    gap = np.maximum((tau - r_loss) / (BOUNDS[1] - BOUNDS[0]), 0.0)
    pval = np.where(r_loss < tau, np.exp(-2 * ess * gap**2), 1.0)
    ltt = LAM_MAX
    for j in range(len(lams) - 1, -1, -1):
        if pval[j] > delta:
            break
        ltt = lams[j]
    return hat, crc, ltt, (r_cost, lams)


@pytest.mark.parametrize("seed, n, tau, delta", [(0, 3, 0.0, 0.3), (1, 6, -0.2, 0.1), (2, 2, 0.1, 0.3)])
def test_weighted_lambdas_equal_a_brute_force_over_every_crossing(seed, n, tau, delta):
    s, w = shifted(seed)
    settings = CalibrationSettings(tau=tau, bon_n=n, lambda_search_max=LAM_MAX, bootstrap=400,
                                   cost_bounds=list(BOUNDS), delta=delta, seed=seed)
    rec = calibrate(s, settings, w, min_ess=10)
    hat, crc, ltt, (curve, lams) = brute(s, w, n, tau, delta)
    assert rec["status"] == "interior"
    assert rec["procedures"]["crc"]["feasible"] and rec["procedures"]["ltt"]["feasible"]
    assert rec["lambda_hat"] == pytest.approx(hat, abs=1e-12)
    assert rec["procedures"]["crc"]["lambda"] == pytest.approx(crc, abs=1e-12)
    assert rec["procedures"]["ltt"]["lambda"] == pytest.approx(ltt, abs=1e-12)
    assert rec["certified"] is True
    # the weighting matters here: the plain calibration finds another lambda-hat
    plain = calibrate(s, settings)
    assert plain["lambda_hat"] != rec["lambda_hat"] and "weights" not in plain and "certified" not in plain
    # the record's decoder cost is the weighted mean at lambda-hat; the curves are the weighted g'
    at = np.searchsorted(lams, rec["lambda_hat"])
    assert rec["decoder_cost_at_lambda_hat"] == pytest.approx(curve[at], abs=1e-12)
    assert curve[at] <= tau + 1e-12 < curve[at - 1]
    g_prime = np.asarray(rec["curves"]["g_prime"])
    direct = tau - (w / w.sum()) @ expected(s.reward, s.cost, s.mask, rec["curves"]["lambda"], n, s.cost)[0]
    np.testing.assert_allclose(g_prime, direct, atol=1e-12)
    # LTT's recorded p-value is the Hoeffding bound at the effective sample size
    ess = effective_sample_size(w)
    mean = rec["procedures"]["ltt"]["clipped_mean_cost"]
    assert rec["procedures"]["ltt"]["p_value"] == pytest.approx(math.exp(-2 * ess * ((tau - mean) / 4.0) ** 2))
    assert rec["procedures"]["ltt"]["p_value"] <= delta
    assert "deployment" in rec["guarantee"]["statement"] and "effective sample size" in rec["guarantee"]["statement"]


def test_the_weighted_bootstrap_draws_prompts_uniformly_and_keeps_their_weights():
    s, w = shifted(3)
    tau, n, reps, seed = -0.1, 3, 40, 9
    st = steps(s.reward, s.cost, s.mask, n, LAM_MAX)
    boot = bootstrap(s, tau, 1.0, LAM_MAX, reps, seed, "bon", bon_n=n, bon_steps=st, weights=w)
    lams = crossings(s)
    cost = expected(s.reward, s.cost, s.mask, lams, n, s.cost)[0]
    for b, idx in enumerate(resample_indices(seed, s.n_prompts, reps)):
        counts = np.bincount(idx, minlength=s.n_prompts) * w  # each drawn prompt with its weight
        curve = (counts / counts.sum()) @ cost
        assert boot.lams[b] == pytest.approx(lams[np.argmax(curve <= tau + 1e-12)], abs=1e-12)
    # and the roots machinery agrees with a single weighted row
    lam, _ = roots(st, (w / w.sum())[None, :], tau, LAM_MAX)
    assert lam[0] == pytest.approx(brute(s, w, n, tau, 0.2)[0], abs=1e-12)


@pytest.mark.parametrize("scale", [1.0, 3.7])
def test_equal_weights_give_exactly_the_unweighted_lambdas(scale):
    s, _ = shifted(4)
    settings = CalibrationSettings(tau=-0.1, bon_n=3, lambda_search_max=LAM_MAX, bootstrap=300,
                                   cost_bounds=list(BOUNDS), delta=0.2, seed=2, guarantee="ltt")
    plain = calibrate(s, settings)
    same = calibrate(s, settings, np.full(s.n_prompts, scale), min_ess=10)
    for key in ("lambda_hat", "lambda_star", "decoder_cost_at_lambda_hat", "decoder_cost_at_lambda_star"):
        assert same[key] == plain[key]
    for proc in ("bootstrap", "crc", "ltt"):
        assert same["procedures"][proc]["lambda"] == plain["procedures"][proc]["lambda"]
    assert same["bootstrap"]["quantiles"] == plain["bootstrap"]["quantiles"]
    assert same["certified"] is True


def test_soft_mode_is_refused_with_weights():
    s, w = shifted(5)
    with pytest.raises(ValueError, match="Best-of-N only"):
        calibrate(s, CalibrationSettings(tau=0.0, mode="soft", bootstrap=200), w, min_ess=10)


# ---------------------------------------------------------------------------------------------
# the CLI: the weights file's checks, and the record nothing deploys below min_ess


def write_case(tmp_path, prompts: int = 120, seed: int = 6):
    s, w = shifted(seed, prompts)
    ids = [f"p{i:03d}" for i in range(prompts)]
    rows = [(ids[i], k, s.reward[i, k], s.cost[i, k]) for i in range(prompts) for k in range(s.reward.shape[1])]
    scores = tmp_path / "scores.parquet"
    pd.DataFrame(rows, columns=["prompt_id", "sample_id", "reward", "cost"]).to_parquet(scores)
    return scores, ids, w


def write_weights(path, ids, w, min_ess=20, kind="shift_weights"):
    from lara.read.files import write_table

    meta = {"identity": {"kind": kind, "min_ess": min_ess, "scenario": "drift", "ess": 1.0}} if kind else {}
    write_table(pd.DataFrame({"prompt_id": ids, "weight": w}), path, meta)
    return path


def run_calibrate(scores, weights, out, guarantee="crc"):
    return lara_in_process(["calibrate", "--scores", scores, "--weights", weights, "--tau", "0", "--bon-n", "3",
                            "--lambda-search-max", str(LAM_MAX), "--bootstrap", "200", "--cost-bounds", "[-3, 3]",
                            "--guarantee", guarantee, "--out", out])


def test_cli_writes_a_weighted_record_and_refuses_it_below_min_ess(tmp_path):
    scores, ids, w = write_case(tmp_path)
    ok = write_weights(tmp_path / "w.parquet", ids, w, min_ess=20)
    rc, _, err = run_calibrate(scores, ok, tmp_path / "lam.json")
    assert rc == 0, err
    data = json.loads((tmp_path / "lam.json").read_text())
    assert data["certified"] is True and data["identity"]["kind"] == "lambda_weighted"
    assert data["identity"]["weighted"] is True and data["identity"]["scenario"] == "drift"
    assert data["weights"]["n"] == 120 and data["weights"]["min_ess"] == 20
    assert data["weights"]["ess"] == pytest.approx(effective_sample_size(w))
    assert "--weights" in data["identity"]["made_from"]
    rec = read_lambda(tmp_path / "lam.json")
    assert rec.weighted and rec.certified and rec.lambda_star == data["procedures"]["crc"]["lambda"]

    # a few prompts carry nearly all the weight: ESS below min_ess, written but refused to every decoder
    heavy = np.where(np.arange(120) < 3, 1000.0, 1.0)
    bad = write_weights(tmp_path / "heavy.parquet", ids, heavy, min_ess=20)
    rc, _, err = run_calibrate(scores, bad, tmp_path / "heavy.json", guarantee="bootstrap")
    assert rc == 0, err
    data = json.loads((tmp_path / "heavy.json").read_text())
    ess = effective_sample_size(heavy)
    assert ess < 20 and data["certified"] is False and data["weights"]["ess"] == pytest.approx(ess)
    assert data["guarantee"]["statement"].startswith("not certified")
    with pytest.raises(DataError, match=rf"effective sample size {ess:.1f} is below deployment.shift.min_ess = 20"):
        read_lambda(tmp_path / "heavy.json")
    assert read_lambda(tmp_path / "heavy.json", allow_uncertified=True).certified is False
    # a decoder's lambda setting goes through read_lambda too
    from lara.calibrate.record import resolve_lambda

    with pytest.raises(DataError, match="not certified"):
        resolve_lambda("star", 2.0, tmp_path / "heavy.json")


@pytest.mark.parametrize("case, message", [
    ("zero", "weight of prompt 'p007' is 0.0; every weight must be a finite number > 0"),
    ("negative", "weight of prompt 'p007' is -1.0"),
    ("nan", "weight of prompt 'p007' is nan"),
    ("inf", "weight of prompt 'p007' is inf"),
    ("missing", "calibration prompt 'p007' of .*scores.parquet has no weight"),
    ("extra", "prompt 'zz' is not a calibration prompt of"),
    ("twice", "prompt 'p007' has 2 weights, expected one"),
    ("no identity", "carries no identity"),
])
def test_cli_refuses_invalid_weights_naming_the_file_and_prompt(tmp_path, case, message):
    scores, ids, w = write_case(tmp_path)
    ids, w = list(ids), w.copy()
    if case in ("zero", "negative", "nan", "inf"):
        w[7] = {"zero": 0.0, "negative": -1.0, "nan": np.nan, "inf": np.inf}[case]
    elif case == "missing":
        ids, w = ids[:7] + ids[8:], np.delete(w, 7)
    elif case == "extra":
        ids, w = [*ids, "zz"], np.append(w, 1.0)
    elif case == "twice":
        ids, w = [*ids, "p007"], np.append(w, 1.0)
    path = write_weights(tmp_path / "w.parquet", ids, w, kind=None if case == "no identity" else "shift_weights")
    rc, _, err = run_calibrate(scores, path, tmp_path / "lam.json")
    assert rc != 0 and not (tmp_path / "lam.json").exists()
    assert "--weights" in err and str(path) in err
    assert pytest.importorskip("re").search(message, err), err


def test_cli_refuses_soft_mode_with_weights(tmp_path):
    scores, ids, w = write_case(tmp_path)
    path = write_weights(tmp_path / "w.parquet", ids, w)
    rc, _, err = lara_in_process(["calibrate", "--scores", scores, "--weights", path, "--tau", "-0.1", "--mode",
                                  "soft", "--bootstrap", "200", "--out", tmp_path / "lam.json"])
    assert rc == 2 and f"--weights {path}" in err and "Best-of-N only" in err and not (tmp_path / "lam.json").exists()


def test_cli_refuses_a_guarantee_without_a_weighted_version_naming_the_weights(tmp_path):
    """ltt_wsr has no covariate-shift weighted version: the refusal names --weights (the input that asks for it)."""
    scores, ids, w = write_case(tmp_path)
    path = write_weights(tmp_path / "w.parquet", ids, w)
    rc, _, err = run_calibrate(scores, path, tmp_path / "lam.json", guarantee="ltt_wsr")
    line = [x for x in err.splitlines() if "ERROR" in x]
    assert rc == 2 and len(line) == 1 and f"--weights {path}: calibration.guarantee: ltt_wsr" in line[0]
    assert not (tmp_path / "lam.json").exists()
