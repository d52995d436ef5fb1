"""Lambda after deployment with several constraints (deployment.follows: constraints): the per-constraint online
update and its certificate, the oracle along the record's ray, the arms, and the refusals."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from lara.constraints.decode import select_vector
from lara.deploy.arms import chosen, oracle_vector
from lara.deploy.online import (
    identity_residual,
    run_online,
    running,
    summarise_vector,
)
from tests.conftest import copy_workflow, lara_in_process, run_snakemake

NAMES = ["hate", "offensive"]
TAU = [-0.5, -0.3]


def candidates(seed: int, visits: int = 2000, n: int = 6, m: int = 2):
    """(T, N) rewards and (T, N, m) costs; reward rises with the costs (the conflict), and every visit has a
    candidate with every cost <= -1 (so a large enough lambda holds every tau)."""
    rng = np.random.default_rng(seed)
    costs = rng.uniform(-2.0, 2.0, (visits, n, m))
    calm = rng.random(visits) < 0.6  # benign visits: every candidate well under every tau
    costs[calm] = rng.uniform(-3.0, -1.0, (int(calm.sum()), n, m))
    costs[:, 0] = np.minimum(costs[:, 0], -1.0)
    reward = 0.6 * costs.sum(axis=2) + rng.normal(0.0, 0.3, (visits, n))
    return reward, costs


CASES = [dict(eta=0.05, batch=1, cap=None), dict(eta=0.3, batch=1, cap=None), dict(eta=0.02, batch=7, cap=None),
         dict(eta=0.2, batch=1, cap=0.3), dict(eta=0.1, batch=5, cap=0.5)]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("seed", [1, 2])
def test_the_identity_and_certificate_hold_per_constraint(case, seed):
    reward, costs = candidates(seed)
    eta, batch = case["eta"], case["batch"]
    trace = run_online(reward, costs, [0.1, 0.2], TAU, eta, batch, case["cap"])
    window = 40 * batch
    for j, tau in enumerate(TAU):
        one = trace.coordinate(j)
        # sum (c_j - tau_j) = (lambda_j,end - lambda_j,1 - L_j + U_j) / eta, to rounding
        assert identity_residual(one, tau, eta) < 1e-12
        lhs = np.sum(one.cost - tau)
        rhs = (one.boundaries[-1] - one.boundaries[0] - one.lower.sum() + one.upper.sum()) / eta
        assert math.isclose(lhs, rhs, rel_tol=1e-9, abs_tol=1e-9 * np.abs(one.cost - tau).sum())
        if case["cap"] is not None:
            assert one.boundaries.max() <= case["cap"]
        mean, bound = running(one, tau, eta)
        assert np.all(bound >= mean - 1e-12)
        # every whole-batch window of constraint j is under its certificate
        summary = summarise_vector(trace, NAMES, TAU, eta, window)["constraints"][NAMES[j]]
        csum = np.concatenate([[0.0], np.cumsum(one.cost)])
        starts = np.arange(0, len(one.cost) - window + 1, batch)
        assert np.max((csum[starts + window] - csum[starts]) / window) <= summary["certificate"] + 1e-12
    assert (trace.lower > 0).any()  # the lower clip acts in these streams


def test_the_online_choice_is_the_vector_decoders_and_one_constraint_is_the_scalar_run():
    reward, costs = candidates(3, visits=500)
    costs[::7, 2] = costs[::7, 1]  # exact ties: the decoder's order decides
    reward[::7, 2] = reward[::7, 1]
    trace = run_online(reward, costs, [0.3, 0.1], TAU, 0.0)  # eta 0: a fixed lambda
    np.testing.assert_array_equal(trace.choice, select_vector(reward, costs, np.array([0.3, 0.1])))
    one = run_online(reward, costs[..., :1], [0.2], [-0.5], 0.05)
    scalar = run_online(reward, costs[..., 0], 0.2, -0.5, 0.05)
    np.testing.assert_array_equal(one.choice, scalar.choice)
    np.testing.assert_array_equal(one.boundaries[:, 0], scalar.boundaries)


def test_the_oracle_is_the_smallest_s_along_the_ray_meeting_every_tau():
    reward, costs = candidates(4, visits=60, n=4)
    d = np.array([1.0, 0.5])
    tau = chosen(reward, costs, [0.0, 0.0])[0].mean(axis=0) - 0.25  # lambda = 0 misses both
    s, info = oracle_vector(reward, costs, tau, d)
    assert s is not None and info["s_first"] > 0
    cost, _ = chosen(reward, costs, s * d)
    assert np.all(cost.mean(axis=0) <= tau)
    # brute force: every crossing of two candidates' scores along the ray, and just below the oracle's s
    comb = np.tensordot(costs, d, axes=([2], [0]))
    crossings = sorted({(reward[t, a] - reward[t, b]) / (comb[t, a] - comb[t, b])
                        for t in range(len(reward)) for a in range(4) for b in range(a + 1, 4)
                        if comb[t, a] != comb[t, b] and (reward[t, a] - reward[t, b]) / (comb[t, a] - comb[t, b]) > 0})
    points = sorted({0.0, *crossings, *[c * (1 + 1e-9) for c in crossings]})
    feasible = [p for p in points if np.all(chosen(reward, costs, p * d)[0].mean(axis=0) <= tau)]
    assert math.isclose(min(feasible), info["s_first"], rel_tol=1e-6)
    below = info["s_first"] * (1 - 1e-7)
    assert not np.all(chosen(reward, costs, below * d)[0].mean(axis=0) <= tau)
    # a tau below every candidate's reach: no s meets it
    assert oracle_vector(reward, costs, np.array([-5.0, -5.0]), d)[0] is None


# ---------------------------------------------------------------------------------------------------------------
# the steps on small files


def constraints_json(names=NAMES, taus=TAU):
    return json.dumps([{"name": n, "cost": "hatesonar", "tau": t} for n, t in zip(names, taus, strict=True)])


def write_inputs(tmp_path, visits: int = 300, n: int = 4, k: int = 6):
    rng = np.random.default_rng(7)
    strata = ["benign"] * 10 + ["harmful"] * 10 + ["held_out"] * 4
    prompts = pd.DataFrame({"prompt": [f"request number {i}" for i in range(len(strata))], "stratum": strata})
    prompts.to_json(tmp_path / "pool.jsonl", orient="records", lines=True)
    pd.DataFrame({"prompt_id": ["c1"], "prompt": ["a calibration prompt"]}).to_parquet(tmp_path / "cal.parquet")
    rc, _, err = lara_in_process(["deployment-pool", "--source", tmp_path / "pool.jsonl", "--calibration",
                                  tmp_path / "cal.parquet", "--out", tmp_path / "pool.parquet"])
    assert rc == 0, err
    pl = pd.read_parquet(tmp_path / "pool.parquet")
    rows = []
    for pid, stratum in zip(pl["prompt_id"], pl["stratum"], strict=True):
        base = {"benign": -1.5, "harmful": 0.0, "held_out": 0.5}[stratum]
        for j in range(k):
            c = [base + rng.normal(), base + rng.normal()] if j else [-1.5, -1.2]
            rows.append({"prompt_id": pid, "sample_id": j, "reward": 0.5 * sum(c) + rng.normal(0, 0.2),
                         "cost_hate": c[0], "cost_offensive": c[1]})
    pd.DataFrame(rows).to_parquet(tmp_path / "scores.parquet")
    from lara import identity
    from lara.io import write_json

    made = identity.stamp("lambda_vector", tmp_path / "lambda.json", role="calibration", tau=TAU, names=NAMES,
                          decoder={"kind": "best_of_n", "n": n, "k": k})
    record = {"identity": made, "names": NAMES, "tau": TAU, "lambda_star": [0.1, 0.05],
              "direction": [1.0, 0.5], "feasible": True, "decoder": {"kind": "best_of_n", "n": n, "k": k},
              "procedures": {"ltt": {"lambda": [0.4, 0.2], "feasible": True},
                             "ltt_wsr": {"lambda": [0.3, 0.15], "feasible": False}}}
    write_json(tmp_path / "lambda.json", record)
    return json.dumps({"tau": -0.5, "bon_n": n, "samples_per_prompt": k, "stream_length": visits, "window": 100,
                       "follows": "constraints"})


def test_the_vector_deployment_steps_end_to_end(tmp_path):
    settings = write_inputs(tmp_path)
    spec = constraints_json()
    stream = tmp_path / "stream.parquet"
    rc, _, err = lara_in_process(["make-stream", "--pool", tmp_path / "pool.parquet", "--scores",
                                  tmp_path / "scores.parquet", "--scenario", "heavy", "--schedule",
                                  json.dumps({"harmful_share": 0.9}), "--settings", settings, "--constraints", spec,
                                  "--out", stream])
    assert rc == 0, err
    df = pd.read_parquet(stream)
    assert {"cost_hate", "cost_offensive"} <= set(df.columns) and "cost" not in df.columns
    online = []
    for eta in (0.05, 0.5):
        out = tmp_path / f"online_{eta}.parquet"
        rc, _, err = lara_in_process(["online", "--candidates", stream, "--lambda-json", tmp_path / "lambda.json",
                                      "--constraints", spec, "--settings", settings, "--step-size", eta,
                                      "--out", out, "--record", tmp_path / f"online_{eta}.json"])
        assert rc == 0, err
        record = json.loads((tmp_path / f"online_{eta}.json").read_text())
        assert record["identity_residual"] < 1e-12 and set(record["constraints"]) == set(NAMES)
        visits = pd.read_parquet(out)
        assert visits["lambda_hate"].iloc[0] == 0.1 and visits["lambda_offensive"].iloc[0] == 0.05
        for name in NAMES:
            assert np.all(visits[f"certificate_{name}"] >= visits[f"mean_cost_{name}"] - 1e-12)
        online.append(out)
    rc, _, err = lara_in_process(["deploy-arms", "--candidates", stream, "--lambda-json", tmp_path / "lambda.json",
                                  "--constraints", spec, "--online", *online, "--settings", settings,
                                  "--out", tmp_path / "arms.csv", "--trace", tmp_path / "trace.parquet"])
    assert rc == 0, err
    table = pd.read_csv(tmp_path / "arms.csv")
    # ltt_wsr certified nothing: no arm; one row per arm and constraint
    assert set(table.arm) == {"fixed_star", "fixed_ltt", "online_eta_0p05", "online_eta_0p5", "oracle"}
    assert len(table) == 5 * 2 and set(table.constraint) == set(NAMES)
    best = table[table.arm == "oracle"]
    assert best.met.all() and best.met_all.all() and np.allclose(best.reward_given_up, 0.0)
    assert np.all(best.lambda_start.to_numpy() / np.array([1.0, 0.5]) == pytest.approx(best.oracle_s.iloc[0]))
    rows = table[table.arm.str.startswith("online")]
    assert np.all(rows.mean_cost <= rows.mean_certificate + 1e-12) and rows.certificate.notna().all()
    assert list(table.set_index(["arm", "constraint"]).loc[("online_eta_0p5", "hate"), ["tau"]]) == [-0.5]
    trace = pd.read_parquet(tmp_path / "trace.parquet")
    assert len(trace) == 300 * 10 and set(trace.constraint) == set(NAMES)
    rc, _, err = lara_in_process(["deployment-report", "--arms", tmp_path / "arms.csv", "--out",
                                  tmp_path / "report.csv"])
    assert rc == 0, err
    assert len(pd.read_csv(tmp_path / "report.csv")) == 10
    from lara.evaluate.deployment_report import read_report, report_lines

    text = "\n".join(report_lines(read_report(tmp_path / "report.csv"), tmp_path / "report.csv"))
    assert "offensive" in text and "fixed LTT lambda" in text and "online eta=0.5" in text
    # the deployment figure draws one cost against one tau: a report per constraint is refused, not drawn as one
    rc, _, err = lara_in_process(["figure", "--kind", "deployment", "--report", tmp_path / "report.csv", "--traces",
                                  tmp_path / "trace.parquet", "--png", tmp_path / "f.png", "--pdf", tmp_path / "f.pdf",
                                  "--provenance", tmp_path / "f.json"])
    assert rc == 2 and "a report of the vector deployment" in err and "report.csv" in err
    assert not (tmp_path / "f.png").exists()
    refusals(tmp_path, settings, spec, stream, online)


def refusals(tmp_path, settings, spec, stream, online):
    """One-line errors naming the file or the key."""
    base = ["--candidates", stream, "--settings", settings, "--out", tmp_path / "o.parquet", "--record",
            tmp_path / "o.json"]
    # a record for other constraints
    from lara.io import write_json

    other = json.loads((tmp_path / "lambda.json").read_text()) | {"names": ["hate", "violence"]}
    write_json(tmp_path / "other.json", other)
    rc, _, err = lara_in_process(["online", *base, "--lambda-json", tmp_path / "other.json", "--constraints", spec])
    assert rc != 0 and "other.json" in err and "constraints" in err
    # the scalar record where the vector one belongs
    (tmp_path / "scalar.json").write_text(json.dumps({"lambda_star": 0.1, "tau": -0.5}))
    rc, _, err = lara_in_process(["online", *base, "--lambda-json", tmp_path / "scalar.json", "--constraints", spec])
    assert rc != 0 and "scalar.json" in err
    # a stream without a constraint's cost column
    df = pd.read_parquet(stream).drop(columns="cost_offensive")
    df.to_parquet(tmp_path / "short.parquet")
    from lara.constraints.spec import from_arg
    from lara.data.errors import DataError
    from lara.deploy.online import read_stream

    with pytest.raises(DataError, match=r"short\.parquet: missing column\(s\) cost_offensive"):
        read_stream(tmp_path / "short.parquet", from_arg(spec))
    # scores without a constraint's column
    pd.read_parquet(tmp_path / "scores.parquet").drop(columns="cost_hate").to_parquet(tmp_path / "s2.parquet")
    rc, _, err = lara_in_process(["make-stream", "--pool", tmp_path / "pool.parquet", "--scores",
                                  tmp_path / "s2.parquet", "--scenario", "x", "--schedule", "{}", "--settings",
                                  settings, "--constraints", spec, "--out", tmp_path / "x.parquet"])
    assert rc != 0 and "s2.parquet" in err and "cost_hate" in err
    # a window longer than the stream
    long = json.dumps(json.loads(settings) | {"window": 400, "stream_length": 400})
    rc, _, err = lara_in_process(["online", *base, "--lambda-json", tmp_path / "lambda.json", "--constraints", spec,
                                  "--settings", long])
    assert rc != 0 and "deployment" in err and ("window" in err or "stream_length" in err)
    # --constraints against deployment.follows, both ways
    scalar_settings = json.dumps(json.loads(settings) | {"follows": "scalar"})
    rc, _, err = lara_in_process(["online", *base, "--lambda-json", tmp_path / "lambda.json", "--constraints", spec,
                                  "--settings", scalar_settings])
    assert rc != 0 and "deployment.follows" in err
    rc, _, err = lara_in_process(["online", *base, "--lambda-json", tmp_path / "lambda.json"])
    assert rc != 0 and "stream.parquet" in err and "cost" in err  # read as the scalar stream it is not
    # a stream made under another definition of a constraint of the same name (its loss: the raw score, not the
    # probability constraint's 1[c > threshold]) is another stream
    prob = json.dumps([{**c, "kind": "probability", "threshold": 0.0, "tau": 0.3} if c["name"] == "offensive" else c
                       for c in json.loads(spec)])
    rc, _, err = lara_in_process(["online", *base, "--lambda-json", tmp_path / "lambda.json", "--constraints", prob])
    assert rc != 0 and "stream.parquet" in err and "loss of constraint offensive" in err
    # a weighted lambda in the vector mode
    rc, _, err = lara_in_process(["deploy-arms", "--candidates", stream, "--lambda-json", tmp_path / "lambda.json",
                                  "--constraints", spec, "--online", *online, "--settings", settings, "--weighted",
                                  tmp_path / "w.json", "--out", tmp_path / "a.csv", "--trace", tmp_path / "t.parquet"])
    assert rc != 0 and "w.json" in err and len([line for line in err.splitlines() if "ERROR" in line]) == 1


# ---------------------------------------------------------------------------------------------------------------
# the workflow: deployment.follows: constraints plans the vector deployment rules


def test_a_dry_run_following_the_constraints_plans_the_vector_deployment(tmp_path):
    wf = copy_workflow(tmp_path / "wf")
    (tmp_path / "c.yaml").write_text("deployment:\n  follows: constraints\n")
    proc = run_snakemake(wf, "-n", "-p", "--configfile", str(tmp_path / "c.yaml"), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    commands = [line.strip().removeprefix("Shell command:").strip() for line in out.splitlines()]
    commands = [c for c in commands if c.startswith("lara ")]
    scored = [c for c in commands if c.startswith("lara score-constraints") and "deployment/samples.parquet" in c]
    assert len(scored) == 1 and "constraints/deployment_scores.parquet" in scored[0]
    for step, count in (("make-stream", 4), ("online", 12), ("deploy-arms", 4)):
        planned = [c for c in commands if c.startswith(f"lara {step} ")]
        assert len(planned) == count and all("--constraints" in c for c in planned), step
    arms = [c for c in commands if c.startswith("lara deploy-arms ")]
    assert all("constraints/lambda.json" in c and "--weighted" not in c for c in arms)
    assert not [c for c in commands if "lambda_weighted.json" in c or "--kind deployment" in c]
    assert [c for c in commands if c.startswith("lara deployment-report ")]
    assert [c for c in commands if c.startswith("lara shift-check ")]  # the shift check is about prompts only


def test_following_the_constraints_needs_constraints():
    from lara.config.plan import deployment_follows_constraints

    config = {"deployment": {"follows": "constraints", "scenarios": [{"name": "a"}]},
              "calibration": {"constraints": []}}
    (problem,) = deployment_follows_constraints(config)
    assert problem.startswith("deployment.follows: constraints") and "calibration.constraints is empty" in problem
    assert deployment_follows_constraints(config | {"deployment": {"follows": "scalar", "scenarios": []}}) == []


def test_a_probability_constraints_stream_holds_its_loss(tmp_path):
    """A probability constraint (P(c > threshold) <= tau) is followed on its loss 1[c > threshold]: the stream's
    cost column, and with it the online lambda and every arm, hold what the vector lambda was calibrated on."""
    from lara.constraints.spec import parse
    from lara.deploy.stream import read_pool

    write_inputs(tmp_path)
    cons = parse([{"name": "hate", "cost": "hatesonar", "tau": -0.5},
                  {"name": "offensive", "cost": "hatesonar", "kind": "probability", "threshold": 0.0, "tau": 0.3}])
    pool = read_pool(tmp_path / "pool.parquet", tmp_path / "scores.parquet", 4, cons)
    scores = pd.read_parquet(tmp_path / "scores.parquet")
    live = pool.cost[pool.mask]
    assert set(np.unique(live[:, 1])) == {0.0, 1.0}  # the loss, not the score
    assert live[:, 1].sum() == (scores["cost_offensive"] > 0).sum()
    assert np.allclose(np.sort(live[:, 0]), np.sort(scores["cost_hate"]))  # a mean constraint keeps its cost
