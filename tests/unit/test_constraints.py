"""The constraints stage (lara.constraints): the constraint list, the per-category preference view, the vector
calibration (one constraint = the scalar calibration bit for bit; two = exact along its ray, checked against a
brute-force grid), the vector Best-of-N decoder, and the joint held-out verdict."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.calibrate import CalibrationSettings, calibrate
from lara.calibrate.dual import PromptScores
from lara.calibrate.vector import expected_vector
from lara.config import ConfigError
from lara.constraints import spec
from lara.constraints.audit import joint_verdict
from lara.constraints.calibrate import VectorScores, brute_force, vector_calibrate
from lara.constraints.decode import read_vector, resolve_vector, select_vector
from lara.constraints.pairs import category_view
from lara.stats import VERDICTS


def world(seed: int, prompts: int = 60, k: int = 8, m: int = 2):
    rng = np.random.default_rng(seed)
    costs = rng.normal(0.0, 1.0, (prompts, k, m))
    reward = costs.sum(axis=2) * 0.6 + rng.normal(0.0, 0.5, (prompts, k))
    return VectorScores(reward, costs, np.ones((prompts, k), dtype=bool), np.arange(prompts))


def settings(**kw):
    base = dict(tau=0.0, bootstrap=400, quantile=0.9, bon_n=4, lambda_search_max=5.0, seed=3)
    return CalibrationSettings(**(base | kw))


def constraints(*taus):
    return [spec.Constraint(f"c{j}", f"category:c{j}", t) for j, t in enumerate(taus)]


# -- the list ------------------------------------------------------------------------------------------------


def test_parse_checks_every_entry():
    got = spec.parse([{"name": "violence", "cost": "category:violence", "tau": -1},
                      {"name": "hate", "cost": "hatesonar", "tau": 0.1, "evaluation": "hatesonar"}])
    assert [c.name for c in got] == ["violence", "hate"] and got[0].category == "violence" and got[1].category is None
    assert got[0].column == "cost_violence" and got[0].tau == -1.0
    pku = spec.parse([{"name": "privacy", "cost": "category:Privacy Violation", "tau": 0}])[0]
    assert pku.category == "Privacy Violation" and pku.slug == "privacy_violation"  # models/cost_privacy_violation
    with pytest.raises(ConfigError, match="share the file name"):
        spec.parse([{"name": "a", "cost": "category:Privacy Violation", "tau": 0},
                    {"name": "b", "cost": "category:privacy violation", "tau": 0}])
    for bad, says in [([{"name": "a", "cost": "cost", "tau": 0}, {"name": "a", "cost": "cost", "tau": 1}], "twice"),
                      ([{"name": "A", "cost": "cost", "tau": 0}], "lower-case"),
                      ([{"name": "a", "cost": "cost"}], "missing"),
                      ([{"name": "a", "cost": "cost", "tau": float("nan")}], "finite"),
                      ([{"name": "a", "cost": "cost", "tau": True}], "finite"),
                      ([{"name": "a", "cost": "category:", "tau": 0}], "category"),
                      ([{"name": "a", "cost": "cost", "tau": 0, "budget": 1}], "unknown")]:
        with pytest.raises(ConfigError, match=says):
            spec.parse(bad)
    with pytest.raises(ConfigError, match="no constraints"):
        spec.from_arg("[]")
    for bad in ([1.0], [2.0, 1.0], [0.0, float("inf")], "wide"):
        with pytest.raises(ConfigError, match="bounds"):
            spec.parse([{"name": "a", "cost": "cost", "tau": 0, "bounds": bad}])


def test_each_constraint_s_own_bounds_reach_ltt():
    w = world(4)
    own = [spec.Constraint("c0", "cost", -0.2, None, (-3.0, 3.0)), spec.Constraint("c1", "cost", -0.1)]
    assert spec.bounds(own, None) is None and spec.bounds(own, [-4.0, 4.0]) == [[-3.0, 3.0], [-4.0, 4.0]]
    got = vector_calibrate(w, own, settings(cost_bounds=[-4.0, 4.0]))
    assert got["procedures"]["ltt"]["bounds"] == [[-3.0, 3.0], [-4.0, 4.0]]
    live = w.costs.reshape(-1, 2)
    assert got["procedures"]["ltt"]["clipped_fraction"][0] == pytest.approx(float(np.mean(np.abs(live[:, 0]) > 3)))
    assert "ltt" not in vector_calibrate(w, own, settings())["procedures"]  # no bounds for c1: no LTT


# -- the per-category view -------------------------------------------------------------------------------------


def pairs():
    h = lambda v, c: {"violence": v, "crime": c}  # noqa: E731
    return pd.DataFrame({
        "prompt": ["p0", "p1", "p2", "p3"], "response_0": ["a", "b", "c", "d"], "response_1": ["e", "f", "g", "h"],
        "better_response_id": [0, 1, 0, 1], "safer_response_id": [1, 0, 1, 1],
        "is_response_0_safe": [False, True, False, True], "is_response_1_safe": [True, False, False, True],
        "response_0_harm_category": [h(True, False), h(False, False), h(False, True), h(False, False)],
        "response_1_harm_category": [h(False, False), h(True, False), h(False, True), h(False, False)]})


def test_category_view_relabels_by_the_category_alone():
    out, info = category_view(pairs(), "violence", seed=0)
    assert out["is_response_0_safe"].tolist() == [False, True, True, True]
    assert out["is_response_1_safe"].tolist() == [True, False, True, True]
    assert out["safer_response_id"].iloc[0] == 1 and out["safer_response_id"].iloc[1] == 0  # labels differ: decisive
    assert info["pairs_labels_differ"] == 2 and "response_0_harm_category" not in out.columns
    # row 2 is harmful in crime only: in the violence view both its responses are safe
    crime, _ = category_view(pairs(), "crime", seed=0)
    assert not crime["is_response_0_safe"].iloc[2] and out["is_response_0_safe"].iloc[2]


def test_category_view_refuses_what_is_not_labelled():
    from lara.read.files import DataError

    with pytest.raises(DataError, match="not labelled"):
        category_view(pairs(), "privacy", seed=0)
    with pytest.raises(DataError, match="per-category labels"):
        category_view(pairs().drop(columns=["response_1_harm_category"]), "violence", seed=0)


def test_ingest_keeps_and_checks_the_category_labels():
    from lara.data.ingest import normalise_preferences
    from lara.read.files import DataError

    df, _ = normalise_preferences(pairs(), "src")
    assert df["response_0_harm_category"].iloc[0] == {"crime": False, "violence": True}
    bad = pairs()
    bad.at[1, "response_1_harm_category"] = {"violence": True}
    with pytest.raises(DataError, match="response_1_harm_category.*row 1"):
        normalise_preferences(bad, "src")
    with pytest.raises(DataError, match="come in pairs"):
        normalise_preferences(pairs().drop(columns=["response_0_harm_category"]), "src")


def test_the_oracle_scores_each_category():
    from lara.toy.score import OracleScorer
    from lara.toy.world import HARM_CATEGORIES, all_requests, make_response

    req = next(r for r in all_requests() if r.topic.name == "poison")
    text = make_response(np.random.default_rng(0), req, "comply")
    v = OracleScorer("violence").score([req.text], [text])[0]
    c = OracleScorer("crime").score([req.text], [text])[0]
    assert v > 0 and c == -1.0 and set(HARM_CATEGORIES) == {"violence", "crime"}
    with pytest.raises(ConfigError, match="harm category"):
        OracleScorer("privacy")


# -- calibration -----------------------------------------------------------------------------------------------


def test_one_constraint_is_the_scalar_calibration_bit_for_bit():
    w = world(1, m=1)
    s = settings(tau=-0.3)
    got = vector_calibrate(w, constraints(-0.3), s)
    want = calibrate(PromptScores(w.reward, w.costs[..., 0], w.mask, w.prompt_ids), s)
    assert got["lambda_hat"] == [want["lambda_hat"]] and got["lambda_star"] == [want["lambda_star"]]
    for lam in np.linspace(0, 3, 31):  # and the decoder picks what the scalar decoder picks
        from lara.calibrate.bestofn import select

        assert np.array_equal(select_vector(w.reward, w.costs, [lam]), select(w.reward, w.costs[..., 0], lam))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_constraints_hat_meets_every_tau_and_nothing_below_it_on_the_ray_does(seed):
    w = world(seed)
    tau = [-0.2, -0.1]
    got = vector_calibrate(w, constraints(*tau), settings(cost_bounds=[-4.0, 4.0]))
    lam = np.asarray(got["lambda_hat"])
    assert got["feasible"] and np.all(lam >= 0)
    exact = expected_vector(w.reward, w.costs, w.mask, lam, 4).mean(axis=0)
    assert np.all(exact <= np.asarray(tau) + 1e-9)
    assert np.allclose(got["decoder_cost_at_lambda_hat"], exact)
    d = np.asarray(got["direction"])
    for frac in np.linspace(0.0, 0.999, 40):  # below lambda-hat along the ray some constraint is missed
        below = expected_vector(w.reward, w.costs, w.mask, frac * lam, 4).mean(axis=0)
        assert np.any(below > np.asarray(tau) + 1e-12), frac
    assert np.allclose(lam / lam.max(), d)
    # the bootstrap's quantile is at or beyond lambda-hat on the same ray for a quantile above a half
    assert np.all(np.asarray(got["lambda_star"]) >= lam - 1e-12)
    # brute force: every procedure's lambda evaluated exactly, and the best feasible grid point no better than
    # what the grid can reach; lambda-hat's reward is within what restricting to one ray costs
    bf = got["brute_force"]
    assert bf["hat"]["feasible"] and bf["feasible_points"] > 0
    assert bf["best"]["reward"] >= bf["hat"]["reward"] - 0.05
    assert set(got["procedures"]) >= {"soft", "hat", "bootstrap", "ltt"}


def test_brute_force_grid_agrees_with_exact_evaluation():
    w = world(5)
    tau = [-0.1, -0.1]
    bf = brute_force(w, tau, 4, {"p": [0.3, 0.7]}, top=2.0, grid=9)
    exact = expected_vector(w.reward, w.costs, w.mask, [0.3, 0.7], 4).mean(axis=0)
    assert np.allclose(bf["p"]["cost"], exact)
    best = bf["best"]["lambda"]
    assert np.all(expected_vector(w.reward, w.costs, w.mask, best, 4).mean(axis=0) <= np.asarray(tau) + 1e-9)


def test_crc_with_several_constraints_is_refused():
    with pytest.raises(ConfigError, match="crc"):
        vector_calibrate(world(0), constraints(0.0, 0.0), settings(guarantee="crc", cost_bounds=[-4.0, 4.0]))


# -- decoding --------------------------------------------------------------------------------------------------


def test_vector_select_maximises_the_combined_score():
    w = world(7)
    lam = [0.4, 1.3]
    pick = select_vector(w.reward, w.costs, lam)
    score = w.reward - (w.costs * np.asarray(lam)).sum(axis=2)
    assert np.array_equal(pick, score.argmax(axis=1))


def test_the_decoder_reads_only_a_vector_record_for_its_constraints(tmp_path):
    from lara.read.files import DataError

    cs = constraints(-0.2, -0.1)
    rec = {"identity": {"kind": "lambda_vector"}, "names": ["c0", "c1"], "tau": [-0.2, -0.1],
           "lambda_hat": [0.1, 0.2], "lambda_star": [0.2, 0.4],
           "procedures": {"hat": {"lambda": [0.1, 0.2]}, "ltt": {"lambda": None}}}
    path = tmp_path / "lambda.json"
    path.write_text(json.dumps(rec))  # an identity without its seal: not what a step wrote
    with pytest.raises(DataError, match="carries no seal"):
        read_vector(path, cs)
    from lara.io import write_json

    write_json(path, rec)  # as calibrate-vector writes it: sealed
    got = read_vector(path, cs)
    assert resolve_vector("star", got, 2, path) == [0.2, 0.4] and resolve_vector("zero", None, 2) == [0.0, 0.0]
    with pytest.raises(DataError, match="no lambda for ltt"):
        resolve_vector("ltt", got, 2, path)
    for change, says in [({"identity": {"kind": "lambda"}}, "lambda_vector"), ({"names": ["c1", "c0"]}, "constraints"),
                         ({"tau": [-0.2, 0.0]}, "tau")]:
        write_json(path, rec | change)
        with pytest.raises(DataError, match=says):
            read_vector(path, cs)


# -- the audit -------------------------------------------------------------------------------------------------


def test_joint_verdict_needs_every_constraint_at_once():
    rng = np.random.default_rng(0)
    ok = rng.normal(-1.0, 0.3, (200, 2))
    rows = [{"verdict": VERDICTS[0]}] * 2
    assert joint_verdict(ok, [0.0, 0.0], rows, 2000, 0)["verdict"] == VERDICTS[0]
    one_over = np.column_stack([ok[:, 0], rng.normal(0.5, 0.3, 200)])
    got = joint_verdict(one_over, [0.0, 0.0], [{"verdict": VERDICTS[0]}, {"verdict": VERDICTS[2]}], 2000, 0)
    assert got["verdict"] == VERDICTS[2] and got["max_excess"] == pytest.approx(one_over[:, 1].mean())
    # the simultaneous bound is at least each constraint's own one-sided bound (the same prompt resamples)
    from lara.stats import bootstrap_means

    edge = rng.normal(-0.05, 0.3, (200, 2))
    j = joint_verdict(edge, [0.0, 0.0], [{"verdict": VERDICTS[1]}] * 2, 2000, 0)
    own = np.quantile(bootstrap_means(edge, 2000, 0), 0.95, axis=0)
    assert j["max_excess_upper95"] >= own.max() - 1e-12
    assert j["max_excess_upper95"] > j["max_excess"]


def test_score_constraints_adds_one_cost_column_per_constraint_in_order(tmp_path):
    import subprocess
    import sys

    from lara import identity
    from lara.read.files import write_table
    from lara.toy.world import all_requests, make_response, oracle_score

    rng = np.random.default_rng(0)
    reqs = [r for r in all_requests() if r.topic.name in ("poison", "lock")][:4]
    rows = [{"prompt_id": f"p{i}", "sample_id": k, "prompt": r.text, "response": make_response(rng, r, style)}
            for i, r in enumerate(reqs) for k, style in enumerate(("comply", "refuse"))]
    src = tmp_path / "samples.parquet"
    write_table(pd.DataFrame(rows), src, {identity.KEY: identity.stamp("samples", src, role="calibration")})
    out = tmp_path / "scores.parquet"
    cmd = [sys.executable, "-m", "lara", "score-constraints", "--input", str(src), "--reward", "oracle",
           "--cost", "crime=oracle", "--cost", "violence=oracle", "--settings", "{}", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    df = pd.read_parquet(out)
    assert list(df.columns[-3:]) == ["reward", "cost_crime", "cost_violence"]
    for row in df.itertuples():
        s = oracle_score(row.prompt, row.response)
        assert row.cost_crime == s.category("crime") and row.cost_violence == s.category("violence")
    assert identity.read_identity(out)["constraints"] == ["crime", "violence"]
    assert identity.read_identity(out)["role"] == "calibration"
    bad = subprocess.run(cmd[:-6] + ["--cost", "crime=oracle", "--cost", "crime=oracle", "--settings", "{}",
                                     "--out", str(tmp_path / "x.parquet")], capture_output=True, text=True)
    assert bad.returncode != 0 and "given twice" in bad.stderr and not (tmp_path / "x.parquet").exists()
