"""The shift check (lara.deploy.shift): the permutation test's size and power, the density-ratio weights against a
known ratio, the deduplicated deployment sample, the settings' checks, and lara shift-check, lara calibrate
--weights and lara prompt-features end to end on small files."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binom

from lara.calibrate.certify import effective_sample_size
from lara.data.errors import DataError
from lara.deploy.features import distinct_prompts
from lara.deploy.shift import (
    P_CLIP,
    ShiftSettings,
    check,
    cross_fit,
    deployment_sample,
    odds,
    two_sample_test,
)
from lara.settings import ConfigError
from tests.conftest import lara_in_process


def gaussian(rng, n_cal: int, n_dep: int, d: int, shift: float = 0.0):
    """Calibration N(0, I) and deployment N(shift e_1 + shift e_2, I) features, labels 0 and 1."""
    x = rng.normal(size=(n_cal + n_dep, d))
    x[n_cal:, :2] += shift
    return x, np.r_[np.zeros(n_cal, dtype=np.int64), np.ones(n_dep, dtype=np.int64)]


def test_the_p_value_counts_the_permuted_cross_fits_at_or_above_the_auc():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(0)
    x, y = gaussian(rng, 60, 40, 5, 0.4)
    t = two_sample_test(x, y, 4, 30, seed=3)
    assert t.auc == roc_auc_score(y, cross_fit(x, y, 4, 3)) and len(t.null) == 30
    assert t.p_value == (1 + (t.null >= t.auc).sum()) / 31
    again = two_sample_test(x, y, 4, 30, seed=3)  # deterministic for a seed
    assert again.auc == t.auc and (again.null == t.null).all() and (again.probabilities == t.probabilities).all()
    assert two_sample_test(x, y, 4, 30, seed=4).null.tolist() != t.null.tolist()
    with pytest.raises(ValueError, match="4 folds need at least 4 prompts in each sample; the smaller has 3"):
        two_sample_test(x[:63], y[:63], 4, 5, seed=0)


@pytest.mark.parametrize("reps, permutations, alpha", [
    (40, 9, 0.1),
    pytest.param(100, 19, 0.05, marks=pytest.mark.slow),
])
def test_the_test_holds_its_size_under_no_shift_and_finds_a_shift(reps, permutations, alpha):
    """One distribution, repeated draws: the false-alarm rate is within a binomial tolerance of alpha (the
    permutation p-value is exactly valid: P(p <= alpha) <= alpha). A mean shift is found in most draws."""
    rng = np.random.default_rng(11)
    alarms = sum(two_sample_test(*gaussian(rng, 40, 40, 8), 3, permutations, seed=r).p_value <= alpha
                 for r in range(reps))
    assert alarms <= binom.ppf(0.999, reps, alpha), f"{alarms} false alarms in {reps} at alpha {alpha}"
    found = sum(two_sample_test(*gaussian(rng, 40, 40, 8, shift=0.9), 3, permutations, seed=r).p_value <= alpha
                for r in range(15))
    assert found >= 12, f"a shift of 0.9 sd in two of eight features found in {found} of 15 draws"


def test_the_weights_estimate_a_known_density_ratio():
    """Calibration N(0, 1), deployment N(mu, 1): the ratio is exp(mu x - mu^2 / 2), which a logistic regression on x
    represents exactly; the odds times n_cal / n_dep estimate it, and their mean over calibration prompts is ~1."""
    rng = np.random.default_rng(2)
    mu, n_cal, n_dep = 0.5, 3000, 1500
    x, y = gaussian(rng, n_cal, n_dep, 1, 0.0)
    x[n_cal:] += mu
    p = cross_fit(x, y, 5, seed=0)
    raw = odds(p[:n_cal], n_cal, n_dep)
    truth = np.exp(mu * x[:n_cal, 0] - mu**2 / 2)
    assert raw.mean() == pytest.approx(1.0, abs=0.05)
    assert np.abs(np.log(raw / truth)).max() < 0.25
    found = check(x, y, ShiftSettings(folds=5, permutations=1, alpha=0.5, seed=0))  # the weights shift-check writes
    w = found["weights"]
    assert w.mean() == pytest.approx(1.0) and w == pytest.approx(raw / raw.mean())
    ess = found["ess"]
    assert ess == pytest.approx(w.sum() ** 2 / (w**2).sum()) == effective_sample_size(w)
    # the population ESS fraction is 1 / E[ratio^2] = exp(-mu^2) (the fitted slope is off by its sampling error)
    assert ess / n_cal == pytest.approx(np.exp(-mu**2), abs=0.08)
    assert np.polyfit(x[:n_cal, 0], np.log(raw), 1)[0] == pytest.approx(mu, abs=0.1)


def test_probabilities_are_clipped_so_no_weight_is_zero_or_infinite():
    w = odds(np.array([0.0, 1e-9, 0.5, 1.0]), 2, 1)
    assert w[0] == w[1] == pytest.approx(2 * P_CLIP / (1 - P_CLIP)) and w[2] == 2.0
    assert w[3] == pytest.approx(2 * (1 - P_CLIP) / P_CLIP) and np.isfinite(w).all() and (w > 0).all()


def test_the_deployment_sample_is_the_first_distinct_prompts_in_order_of_first_visit():
    stream = pd.DataFrame({"t": [0, 0, 1, 1, 2, 2, 3, 3, 4, 4], "prompt_id": list("bbaabbccdd"),
                           "prompt": ["B"] * 2 + ["A"] * 2 + ["B"] * 2 + ["C"] * 2 + ["D"] * 2})
    assert deployment_sample(stream, 3)["prompt_id"].tolist() == ["b", "a", "c"]
    assert deployment_sample(stream.iloc[::-1], 2)["prompt"].tolist() == ["B", "A"]  # by t, not row order
    assert len(deployment_sample(stream, 10)) == 4


def test_settings_refuse_an_alpha_the_permutations_cannot_reach():
    with pytest.raises(ConfigError, match="smallest p-value of 10 permutations"):
        ShiftSettings(permutations=10, alpha=0.05)
    assert ShiftSettings(permutations=19, alpha=0.05).min_ess == 50
    with pytest.raises(ConfigError, match="deployment.shift.folds"):
        ShiftSettings(folds=1)


def test_distinct_prompts_counts_a_prompt_once_and_refuses_one_id_with_two_texts():
    a = pd.DataFrame({"prompt_id": ["x", "y"], "prompt": ["hello", "world"]})
    b = pd.DataFrame({"prompt_id": ["y", "y", "z"], "prompt": ["world", "world", "again"]})
    assert distinct_prompts([("a", a), ("b", b)])["prompt_id"].tolist() == ["x", "y", "z"]
    c = pd.DataFrame({"prompt_id": ["y"], "prompt": ["other"]})
    with pytest.raises(DataError, match="prompt 'y' has one text in a and another in c"):
        distinct_prompts([("a", a), ("c", c)])
    d = pd.DataFrame({"prompt_id": ["w"], "prompt": ["hello"]})
    with pytest.raises(DataError, match="one prompt"):
        distinct_prompts([("a", a), ("d", d)])


# ---------------------------------------------------------------------------------------------
# the steps end to end


def write_inputs(tmp_path, shift: float, n_cal: int = 120, n_pool: int = 80, d: int = 6):
    """Features of calibration and pool prompts, the calibration prompts, a stream over the pool with repeats (and
    its scenario in its identity), and calibration scores whose cost rises with feature f0."""
    from lara.read.files import write_table

    rng = np.random.default_rng(5)
    cal_ids = [f"c{i:03d}" for i in range(n_cal)]
    pool_ids = [f"d{i:03d}" for i in range(n_pool)]
    x, _ = gaussian(rng, n_cal, n_pool, d, shift)
    feats = pd.DataFrame(x.astype(np.float32), columns=[f"f{j}" for j in range(d)])
    feats.insert(0, "prompt_id", cal_ids + pool_ids)
    write_table(feats, tmp_path / "features.parquet")
    write_table(pd.DataFrame({"prompt_id": cal_ids, "prompt": [f"cal {i}" for i in range(n_cal)]}),
                tmp_path / "cal.parquet")
    visits = rng.integers(0, n_pool, 400)
    stream = pd.DataFrame({"t": np.repeat(np.arange(400), 2), "prompt_id": np.repeat(np.array(pool_ids)[visits], 2),
                           "sample_id": np.tile([0, 1], 400), "reward": 0.0, "cost": 0.0})
    stream["prompt"] = stream["prompt_id"].str.replace("d", "deploy ")
    write_table(stream, tmp_path / "stream.parquet", {"identity": {"kind": "stream", "scenario": "drift"}})
    k = 6
    r = rng.normal(size=(n_cal, k))
    c = 0.8 * r + 0.6 * rng.normal(size=(n_cal, k)) + x[:n_cal, :1]
    scores = pd.DataFrame({"prompt_id": np.repeat(cal_ids, k), "sample_id": np.tile(np.arange(k), n_cal),
                           "reward": r.ravel(), "cost": c.ravel()})
    write_table(scores, tmp_path / "scores.parquet")
    return tmp_path


def shift_check(tmp_path, *extra):
    return lara_in_process(["shift-check", "--features", tmp_path / "features.parquet", "--calibration",
                            tmp_path / "cal.parquet", "--deployment", tmp_path / "stream.parquet", "--settings",
                            json.dumps({"n_prompts": 50, "folds": 3, "permutations": 39, "min_ess": 30, "seed": 1}),
                            "--out", tmp_path / "shift.json", "--weights", tmp_path / "weights.parquet", *extra])


def test_shift_check_then_the_weighted_calibration_end_to_end(tmp_path):
    from lara import identity
    from lara.read.files import read_table

    write_inputs(tmp_path, shift=1.0)
    rc, _, err = shift_check(tmp_path)
    assert rc == 0, err
    out = json.loads((tmp_path / "shift.json").read_text())
    assert out["scenario"] == "drift" and out["identity"]["kind"] == "shift_check"
    assert out["n_calibration"] == 120 and out["n_deployment"] == 50 and out["permutations"] == 39
    assert out["shifted"] is True and out["p_value"] == pytest.approx(1 / 40) and out["auc"] > 0.75
    assert out["statement"].startswith("the deployment prompts differ from the calibration prompts")
    assert out["weights_usable"] == (out["ess"] >= 30)
    w = read_table(tmp_path / "weights.parquet")
    made = identity.read_identity(tmp_path / "weights.parquet")
    assert made["kind"] == "shift_weights" and made["scenario"] == "drift" and made["min_ess"] == 30
    assert w["prompt_id"].tolist() == [f"c{i:03d}" for i in range(120)]
    assert w["weight"].mean() == pytest.approx(1.0) and (w["weight"] > 0).all()
    assert effective_sample_size(w["weight"]) == pytest.approx(out["ess"]) == pytest.approx(made["ess"])
    # the prompts the classifier finds deployment-like (large f0, f1) weigh more
    x = read_table(tmp_path / "features.parquet").set_index("prompt_id").loc[w["prompt_id"]]
    assert np.corrcoef(w["weight"], x["f0"] + x["f1"])[0, 1] > 0.5

    rc, _, err = lara_in_process(["calibrate", "--scores", tmp_path / "scores.parquet", "--weights",
                                  tmp_path / "weights.parquet", "--tau", "0", "--bon-n", "3", "--lambda-search-max",
                                  "20", "--bootstrap", "200", "--out", tmp_path / "lam.json"])
    assert rc == 0, err
    rec = json.loads((tmp_path / "lam.json").read_text())
    assert rec["weights"]["ess"] == pytest.approx(out["ess"]) and rec["weights"]["scenario"] == "drift"
    assert rec["certified"] == out["weights_usable"] and rec["identity"]["kind"] == "lambda_weighted"
    plain = lara_in_process(["calibrate", "--scores", tmp_path / "scores.parquet", "--tau", "0", "--bon-n", "3",
                             "--lambda-search-max", "20", "--bootstrap", "200", "--out", tmp_path / "plain.json"])
    assert plain[0] == 0
    # the deployment favours costly prompts (cost rises with f0): the reweighted lambda-hat is larger
    assert rec["lambda_hat"] > json.loads((tmp_path / "plain.json").read_text())["lambda_hat"]


def test_no_shift_is_not_called_a_shift_and_says_it_proves_nothing(tmp_path):
    write_inputs(tmp_path, shift=0.0)
    rc, _, err = shift_check(tmp_path)
    assert rc == 0, err
    out = json.loads((tmp_path / "shift.json").read_text())
    assert out["shifted"] == (out["p_value"] <= 0.05)
    if not out["shifted"]:
        assert "no detectable shift" in out["statement"] and "does not prove there is none" in out["statement"]


def test_shift_check_refuses_prompts_without_features_and_shared_prompts(tmp_path):
    from lara.read.files import read_table, write_table

    write_inputs(tmp_path, shift=0.5)
    feats = read_table(tmp_path / "features.parquet")
    write_table(feats[feats["prompt_id"] != "c007"], tmp_path / "features.parquet")
    rc, _, err = shift_check(tmp_path)
    assert rc != 0 and "prompt 'c007' has no features" in err and "--calibration" in err
    write_table(feats, tmp_path / "features.parquet")
    stream = read_table(tmp_path / "stream.parquet")
    first = stream["prompt_id"].iloc[0]
    cal = read_table(tmp_path / "cal.parquet")
    cal.loc[0, ["prompt_id", "prompt"]] = [first, stream["prompt"].iloc[0]]
    write_table(cal, tmp_path / "cal.parquet")
    rc, _, err = shift_check(tmp_path)
    assert rc != 0 and "are calibration prompts" in err
    assert not (tmp_path / "shift.json").exists() and not (tmp_path / "weights.parquet").exists()


def test_prompt_features_end_to_end(tiny_world, tmp_path):
    """Mean-pooled last hidden states of a tiny Llama: one float32 row per distinct prompt, the same in any batch
    size (to float rounding) and run to run."""
    from lara.read.files import read_table, write_table

    a = pd.DataFrame({"prompt_id": ["p1", "p2", "p3"], "prompt": ["how do I bake bread", "hello", "a b c d e f"]})
    b = pd.DataFrame({"t": [0, 0, 1], "prompt_id": ["p2", "p2", "p4"], "prompt": ["hello", "hello", "tell me more"]})
    write_table(a, tmp_path / "a.parquet")
    write_table(b, tmp_path / "b.parquet")
    outs = []
    for name, batch in (("one", 1), ("two", 4), ("three", 4)):
        rc, _, err = lara_in_process(["prompt-features", "--model", tiny_world["base"], "--prompts",
                                      tmp_path / "a.parquet", tmp_path / "b.parquet", "--batch-size", batch,
                                      "--out", tmp_path / f"{name}.parquet"])
        assert rc == 0, err
        outs.append(read_table(tmp_path / f"{name}.parquet"))
    f = outs[0]
    assert f["prompt_id"].tolist() == ["p1", "p2", "p3", "p4"] and f.shape[1] == 33
    assert all(f[c].dtype == np.float32 for c in f.columns[1:])
    np.testing.assert_allclose(outs[1].iloc[:, 1:], f.iloc[:, 1:], atol=1e-5)
    assert outs[1].equals(outs[2])


def test_a_stream_of_constraint_costs_is_checked_by_its_prompts_alone(tmp_path):
    """The shift check reads which prompts a stream visits, not its costs: a stream of the vector lambda's constraint
    costs (deployment.follows: constraints) gets exactly the check the same visits with one cost column get."""
    from lara.read.files import read_metadata, read_table, write_table

    write_inputs(tmp_path, shift=1.0)
    rc, _, err = shift_check(tmp_path)
    assert rc == 0, err
    scalar = json.loads((tmp_path / "shift.json").read_text())
    stream = read_table(tmp_path / "stream.parquet")
    vector = stream.drop(columns=["cost"]).assign(cost_hate=0.1, cost_offensive=0.2)
    write_table(vector, tmp_path / "stream.parquet", read_metadata(tmp_path / "stream.parquet"))
    rc, _, err = shift_check(tmp_path)
    assert rc == 0, err
    again = json.loads((tmp_path / "shift.json").read_text())
    assert again["auc"] == scalar["auc"] and again["p_value"] == scalar["p_value"]
