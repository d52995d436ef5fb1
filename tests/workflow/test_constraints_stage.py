"""Several constraints at once on the shared toy run: the vector lambda, its decodes, the audit and the coverage
study. The numbers are the run's own; what is asserted holds for any run: lambda-hat meets every tau exactly on
the calibration scores and nothing below it on its ray does, every procedure's reward is no better than the
brute-force best except by the grid's resolution, the audit covers every output and constraint with a joint
verdict that needs them all, and LTT keeps its promise in the coverage study."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.workflow


def constraints_of(toy_run):
    from lara.constraints.spec import parse

    return parse(yaml.safe_load((toy_run / "config/config.yaml").read_text())["calibration"]["constraints"])


def test_the_vector_lambda_meets_every_tau_on_the_calibration_scores(toy_run):
    from lara.calibrate.vector import expected_vector
    from lara.constraints.calibrate import load_vector_scores

    res = toy_run / "results/tiny/constraints"
    cs = constraints_of(toy_run)
    rec = json.loads((res / "lambda.json").read_text())
    assert rec["names"] == [c.name for c in cs] and rec["tau"] == [c.tau for c in cs]
    assert rec["identity"]["kind"] == "lambda_vector" and rec["identity"]["role"] == "calibration"
    w = load_vector_scores(res / "calibration_scores.parquet", cs)
    n, tau = rec["decoder"]["n"], np.array(rec["tau"])
    hat = np.array(rec["lambda_hat"])
    assert np.all(expected_vector(w.reward, w.costs, w.mask, hat, n).mean(axis=0) <= tau + 1e-9)
    assert np.any(expected_vector(w.reward, w.costs, w.mask, 0.999 * hat, n).mean(axis=0) > tau)
    at_zero = expected_vector(w.reward, w.costs, w.mask, np.zeros(len(cs)), n).mean(axis=0)
    assert np.all(at_zero > tau)  # the toy's taus are chosen so every one binds
    if len(cs) != 2:  # the 2-D brute-force check is made for two constraints only
        assert "brute_force" not in rec
        return
    bf = rec["brute_force"]
    for name in ("hat", "bootstrap"):
        assert bf[name]["feasible"] and bf[name]["reward"] <= bf["best"]["reward"] + 0.05


def audit_has(audit: dict, method: str, setting: str) -> bool:
    return any(j["method"] == method and j["setting"] == setting for j in audit["joint"])


def test_every_decoded_output_is_audited_per_constraint_and_jointly(toy_run):
    from lara.stats import VERDICTS

    res = toy_run / "results/tiny/constraints"
    cs = constraints_of(toy_run)
    audit = json.loads((res / "audit.json").read_text())
    rows = pd.DataFrame(audit["rows"])
    outputs = {(j["method"], j["setting"]) for j in audit["joint"]}
    ltts = {("bon", s) for s in ("ltt", "ltt_wsr")}  # an LTT that certified nothing is audited under its own name
    ltts = {(m, s if audit_has(audit, m, s) else f"{s}_uncertified") for m, s in ltts}
    assert outputs == {("bon", s) for s in ("zero", "hat", "star")} | ltts | {("args", s) for s in ("zero", "star")}
    assert len(rows) == len(outputs) * len(cs) and set(rows.constraint) == {c.name for c in cs}
    for j in audit["joint"]:
        own = rows[(rows.method == j["method"]) & (rows.setting == j["setting"])]
        if j["verdict"] == VERDICTS[0]:
            assert (own.verdict == VERDICTS[0]).all()  # jointly met: each is met
        if (own.verdict == VERDICTS[2]).any():
            assert j["verdict"] == VERDICTS[2]
        assert j["max_excess"] == pytest.approx(max(own.mean_cost - own.tau))
    zero = rows[(rows.method == "bon") & (rows.setting == "zero")]
    star = rows[(rows.method == "bon") & (rows.setting == "star")]
    assert (star.mean_cost.to_numpy() < zero.mean_cost.to_numpy()).all()  # lambda* lowers every cost held out
    for name in ("constraints", "constraints_sweep"):
        assert (toy_run / f"results/tiny/figures/{name}.png").stat().st_size > 10_000


def test_the_coverage_study_holds_ltt_to_its_promise(toy_run):
    cov = json.loads((toy_run / "results/tiny/constraints/coverage.json").read_text())
    summary = pd.DataFrame(cov["summary"])
    delta = cov["calibration_settings"]["delta"]
    for name in ("ltt", "ltt_wsr"):  # both bounds keep the promise
        ltt = summary[summary.procedure == name]
        assert len(ltt) and (ltt.violation_lo <= delta).all() and ltt.promise_consistent.all()
    names = [n for n in cov["names"]]
    for _, row in summary.iterrows():  # the joint rate is at least each constraint's own
        assert row.violation_rate >= max(row[f"violation_rate_{n}"] for n in names) - 1e-12
