"""Lambda after deployment (lara.deploy): the online update's identity and certificate, the decoder's choices,
the oracle, the scenarios' streams, the pool, and the steps end to end on small files."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.bestofn import select
from lara.data.errors import DataError
from lara.deploy.arms import chosen, oracle
from lara.deploy.online import identity_residual, run_online, running, summarise, worst_window
from lara.deploy.stream import Pool, Schedule, draw
from lara.settings import ConfigError
from tests.conftest import lara_in_process


def candidates(seed: int, visits: int = 3000, n: int = 8, harmful: float = 0.5):
    """(T, N) rewards and costs: on a harmful visit reward rises with cost (the conflict), on a benign one the
    costs are low; every visit has a candidate with cost <= -1."""
    rng = np.random.default_rng(seed)
    cost = rng.normal(-2.0, 1.0, (visits, n))
    bad = rng.random(visits) < harmful
    cost[bad] = rng.uniform(-1.5, 2.0, (int(bad.sum()), n))
    cost[:, 0] = np.minimum(cost[:, 0], -1.0)
    reward = 0.8 * cost + rng.normal(0.0, 0.3, (visits, n))
    return reward, cost


CASES = [dict(eta=0.05, batch=1, cap=None), dict(eta=0.5, batch=1, cap=None), dict(eta=0.02, batch=7, cap=None),
         dict(eta=0.2, batch=1, cap=0.3), dict(eta=0.1, batch=5, cap=0.5)]


@pytest.mark.parametrize("case", CASES)
def test_the_identity_holds_to_rounding_and_the_certificate_bounds_every_window(case):
    reward, cost = candidates(1)
    tau = -0.5
    trace = run_online(reward, cost, 0.1, tau, case["eta"], case["batch"], case["cap"])
    # sum (c - tau) = (lambda_end - lambda_1 - L + U) / eta, to rounding
    assert identity_residual(trace, tau, case["eta"]) < 1e-12
    lhs = np.sum(trace.cost - tau)
    rhs = (trace.boundaries[-1] - trace.boundaries[0] - trace.lower.sum() + trace.upper.sum()) / case["eta"]
    assert math.isclose(lhs, rhs, rel_tol=1e-9, abs_tol=1e-9 * np.abs(trace.cost - tau).sum())
    # the running certificate is the running mean plus L / (eta t), so never below it
    mean, bound = running(trace, tau, case["eta"])
    assert np.all(bound >= mean - 1e-12)
    ends = np.arange(case["batch"] - 1, len(mean), case["batch"])
    lower = np.cumsum(trace.lower)[: len(ends)]
    np.testing.assert_allclose(bound[ends] - mean[ends], lower / (case["eta"] * (ends + 1)), atol=1e-9)
    # every whole-batch window's mean is under the window certificate, and the worst window is one of them
    window = 50 * case["batch"]
    summary = summarise(trace, tau, case["eta"], window)
    csum = np.concatenate([[0.0], np.cumsum(trace.cost)])
    starts = np.arange(0, len(trace.cost) - window + 1, case["batch"])
    assert np.max((csum[starts + window] - csum[starts]) / window) <= summary["certificate"] + 1e-12
    # the whole stream's mean exceeds tau by at most (lambda_end - lambda_1 + U) / (eta T), short of it by L / (eta T)
    gap = summary["mean_certificate"] - summary["mean_cost"]
    assert math.isclose(gap, trace.lower.sum() / (case["eta"] * len(trace.cost)), rel_tol=1e-9, abs_tol=1e-12)
    if case["cap"] is not None:
        assert trace.boundaries.max() <= case["cap"] and summary["lambda_max"] <= case["cap"]


def test_the_online_decoder_chooses_what_best_of_n_chooses_at_its_lambda_ties_included():
    reward, cost = candidates(2, visits=600)
    reward[::5, 1] = reward[::5, 2] + 0.3 * (cost[::5, 1] - cost[::5, 2])  # a tie in r - 0.3 c between 1 and 2
    trace = run_online(reward, cost, 0.3, 0.0, 1e-16)  # eta tiny: lambda stays at 0.3 (within the tie tolerance)
    want = np.array([select(reward[i:i + 1], cost[i:i + 1], trace.lam[i])[0] for i in range(len(reward))])
    np.testing.assert_array_equal(trace.choice, want)
    tied = np.arange(0, 600, 5)
    top = tied[np.isin(trace.choice[tied], (1, 2))]  # the tied pair on top: the lower cost wins
    assert len(top) > 5 and np.all(cost[top, trace.choice[top]] == np.minimum(cost[top, 1], cost[top, 2]))


def test_online_holds_tau_where_the_calibrated_lambda_does_not():
    tau = -0.5
    reward, cost = candidates(3, harmful=0.2)
    lam_star = oracle(reward, cost, tau)  # "calibrated" on a mild mix: exactly meets tau there
    heavy_r, heavy_c = candidates(4, harmful=0.9)
    fixed_cost, _ = chosen(heavy_r, heavy_c, lam_star)
    assert fixed_cost.mean() > tau + 0.2  # the shift breaks the fixed lambda
    trace = run_online(heavy_r, heavy_c, lam_star, tau, 0.2)
    summary = summarise(trace, tau, 0.2, 300)
    assert summary["mean_cost"] <= tau + (summary["lambda_end"] - summary["lambda_start"]) / (0.2 * 3000) + 1e-9
    assert summary["mean_cost"] <= tau + 0.05 and summary["worst_window_cost"] <= summary["certificate"] + 1e-12


def test_with_no_safe_enough_candidate_lambda_grows_and_the_certificate_says_tau_is_not_held():
    reward, cost = candidates(5)
    cost += 3.0  # now the safest candidates average above tau = -0.5
    assert oracle(reward, cost, -0.5) is None
    free = summarise(run_online(reward, cost, 0.0, -0.5, 0.05), -0.5, 0.05, 300)
    assert free["lambda_end"] > 10 and free["certificate"] > -0.5 and free["mean_cost"] > -0.5
    capped = run_online(reward, cost, 0.0, -0.5, 0.05, cap=2.0)
    s = summarise(capped, -0.5, 0.05, 300)
    assert capped.upper.sum() > 0 and s["lambda_end"] == 2.0 and s["certificate"] > s["worst_window_cost"] - 1e-12


def test_the_oracle_is_the_smallest_fixed_lambda_meeting_tau():
    reward, cost = candidates(6, visits=800)
    tau = -0.6
    lam = oracle(reward, cost, tau)
    assert lam > 0 and chosen(reward, cost, lam)[0].mean() <= tau
    assert chosen(reward, cost, lam * (1 - 1e-6))[0].mean() > tau
    grid = np.linspace(0, 2 * lam, 400)
    means = np.array([chosen(reward, cost, g)[0].mean() for g in grid])
    assert np.all(np.diff(means) <= 1e-12)  # non-increasing in lambda: why the smallest one is the best one
    assert grid[np.argmax(means <= tau)] >= lam - 1e-9
    assert oracle(reward, cost, 10.0) == 0.0


def test_worst_window():
    assert worst_window(np.array([0.0, 1.0, 1.0, 0.0]), 2) == 1.0
    assert worst_window(np.array([3.0, 1.0]), 5) == 2.0


# ---------------------------------------------------------------------------------------------
# streams


def pool(k: int = 6, held: int = 4) -> Pool:
    strata = ["benign"] * 10 + ["harmful"] * 10 + ["held_out"] * held
    p = len(strata)
    rng = np.random.default_rng(0)
    ids = np.array([f"p{i}" for i in range(p)], dtype=object)
    return Pool(ids, np.array([f"q {i}" for i in range(p)], dtype=object), np.array(strata, dtype=object),
                rng.normal(size=(p, k)), rng.normal(size=(p, k)), np.tile(np.arange(k), (p, 1)),
                np.ones((p, k), dtype=bool))


def test_a_stream_follows_its_schedule():
    pl = pool()
    rows, cols = draw(pl, Schedule("heavy", (0.9, 0.9), (0.0, 0.0)), 4000, 4, 0)
    harmful = np.mean(pl.stratum[rows] == "harmful")
    assert abs(harmful - 0.9) < 4 * math.sqrt(0.09 / 4000) and not np.any(pl.stratum[rows] == "held_out")
    control_rows, _ = draw(pl, Schedule("control", None, (0.0, 0.0)), 4000, 4, 0)
    assert abs(np.mean(pl.stratum[control_rows] == "harmful") - 0.5) < 4 * math.sqrt(0.25 / 4000)
    rows, _ = draw(pl, Schedule("drift", (0.0, 1.0), (0.0, 0.0)), 4000, 4, 0)
    first, last = (np.mean(pl.stratum[r] == "harmful") for r in (rows[:1000], rows[-1000:]))
    assert first < 0.2 and last > 0.8
    rows, _ = draw(pl, Schedule("topic", None, (0.3, 0.3)), 4000, 4, 0)
    assert abs(np.mean(pl.stratum[rows] == "held_out") - 0.3) < 4 * math.sqrt(0.21 / 4000)
    # N distinct candidates per visit, sorted; the same seed the same stream, another scenario another
    assert np.all(np.diff(cols, axis=1) > 0) and cols.max() < 6
    again = draw(pl, Schedule("heavy", (0.9, 0.9), (0.0, 0.0)), 4000, 4, 0)
    other = draw(pl, Schedule("heavy2", (0.9, 0.9), (0.0, 0.0)), 4000, 4, 0)
    np.testing.assert_array_equal(again[0], draw(pl, Schedule("heavy", (0.9, 0.9), (0.0, 0.0)), 4000, 4, 0)[0])
    assert not np.array_equal(again[0], other[0])


def test_a_schedule_that_draws_a_missing_stratum_or_an_invalid_share_is_refused():
    with pytest.raises(DataError, match="held_out prompts but the pool has none"):
        draw(pool(held=0), Schedule("topic", None, (0.3, 0.3)), 100, 4, 0)
    with pytest.raises(ConfigError, match="deployment.scenarios.x.harmful_share"):
        Schedule.from_mapping("x", {"harmful_share": 1.5})
    with pytest.raises(ConfigError, match="unknown key"):
        Schedule.from_mapping("x", {"harmfull_share": 0.5})
    assert Schedule.from_mapping("d", {"harmful_share": [0.5, 1.0]}).harmful_share == (0.5, 1.0)


# ---------------------------------------------------------------------------------------------
# the steps end to end


def write_inputs(tmp_path, visits: int = 400, n: int = 4, k: int = 6):
    rng = np.random.default_rng(7)
    strata = ["benign"] * 12 + ["harmful"] * 12 + ["held_out"] * 4
    prompts = pd.DataFrame({"prompt": [f"request number {i}" for i in range(len(strata))], "stratum": strata})
    prompts.to_json(tmp_path / "pool.jsonl", orient="records", lines=True)
    pd.DataFrame({"prompt_id": ["c1", "c2"], "prompt": ["a calibration prompt", "another one"]}).to_parquet(
        tmp_path / "cal.parquet")
    rc, _, err = lara_in_process(["deployment-pool", "--source", tmp_path / "pool.jsonl", "--calibration",
                                  tmp_path / "cal.parquet", "--out", tmp_path / "pool.parquet"])
    assert rc == 0, err
    pl = pd.read_parquet(tmp_path / "pool.parquet")
    rows = []
    for pid, stratum in zip(pl["prompt_id"], pl["stratum"], strict=True):
        base = {"benign": -2.0, "harmful": 0.0, "held_out": 1.0}[stratum]
        for j in range(k):
            c = base + rng.normal() if j else -1.5
            rows.append({"prompt_id": pid, "sample_id": j, "reward": 0.7 * c + rng.normal(0, 0.2), "cost": c})
    pd.DataFrame(rows).to_parquet(tmp_path / "scores.parquet")
    record = {"lambda_hat": 0.05, "lambda_star": 0.1, "tau": -0.5, "mode": "bon", "feasible": True,
              "status": "interior", "decoder": {"kind": "best_of_n", "n": n, "k": k},
              "bootstrap": {"quantile": 0.975, "quantiles": {"0.975": 0.1}},
              "procedures": {"ltt": {"lambda": 0.4, "feasible": True}}}
    (tmp_path / "lambda.json").write_text(json.dumps(record))
    return json.dumps({"tau": -0.5, "bon_n": n, "samples_per_prompt": k, "stream_length": visits, "window": 100})


def test_the_deployment_steps_end_to_end(tmp_path):
    settings = write_inputs(tmp_path)
    arms = []
    for scenario, schedule in (("control", {}), ("heavy", {"harmful_share": 0.9, "held_out_share": 0.2})):
        d = tmp_path / scenario
        d.mkdir()
        rc, _, err = lara_in_process(["make-stream", "--pool", tmp_path / "pool.parquet", "--scores",
                                      tmp_path / "scores.parquet", "--scenario", scenario, "--schedule",
                                      json.dumps(schedule), "--settings", settings, "--out", d / "stream.parquet"])
        assert rc == 0, err
        stream = pd.read_parquet(d / "stream.parquet")
        assert len(stream) == 400 * 4 and stream.groupby("t")["prompt_id"].nunique().max() == 1
        online = []
        for eta in (0.05, 0.5):
            out = d / f"online_{eta}.parquet"
            rc, _, err = lara_in_process(["online", "--candidates", d / "stream.parquet", "--lambda-json",
                                          tmp_path / "lambda.json", "--settings", settings, "--step-size", eta,
                                          "--out", out, "--record", d / f"online_{eta}.json"])
            assert rc == 0, err
            record = json.loads((d / f"online_{eta}.json").read_text())
            assert record["identity_residual"] < 1e-12 and "every window of 100 visits" in record["statement"]
            visits = pd.read_parquet(out)
            assert list(visits["t"]) == list(range(400)) and visits["lambda"].iloc[0] == 0.1
            assert np.all(visits["certificate"] >= visits["mean_cost"] - 1e-12)
            online.append(out)
        rc, _, err = lara_in_process(["deploy-arms", "--candidates", d / "stream.parquet", "--lambda-json",
                                      tmp_path / "lambda.json", "--online", *online, "--settings", settings,
                                      "--out", d / "arms.csv", "--trace", d / "trace.parquet"])
        assert rc == 0, err
        table = pd.read_csv(d / "arms.csv")
        assert set(table.arm) == {"fixed_star", "fixed_ltt", "online_eta_0p05", "online_eta_0p5", "oracle"}
        best = table.set_index("arm").loc["oracle"]
        assert best.met and abs(best.reward_given_up) < 1e-12 and best.mean_cost <= -0.5
        fixed = table.set_index("arm").loc[["fixed_star", "fixed_ltt"]]
        assert np.all(fixed.reward_given_up[fixed.met] >= -1e-12)  # a fixed lambda that meets tau gains nothing
        online_rows = table[table.arm.str.startswith("online")]
        assert np.all(online_rows.mean_cost <= online_rows.mean_certificate + 1e-12)
        trace = pd.read_parquet(d / "trace.parquet")
        assert set(trace.arm) == set(table.arm) and len(trace) == 400 * len(table)
        arms.append(d / "arms.csv")
    rc, _, err = lara_in_process(["deployment-report", "--arms", *arms, "--out", tmp_path / "report.csv"])
    assert rc == 0, err
    report = pd.read_csv(tmp_path / "report.csv")
    assert set(report.scenario) == {"control", "heavy"} and len(report) == 10
    assert set(report.offline_guarantee) == {"unknown (no shift check)"}  # no --shift given
    from lara.deploy.report import carries_over

    assert carries_over({"shifted": True, "auc": 0.7, "p_value": 0.01}).startswith("does not carry over")
    assert carries_over({"shifted": False, "auc": 0.5, "p_value": 0.6}).startswith("no detectable shift")
    # the same arms file twice, an online run of another stream, another tau: refused with the file named
    rc, _, err = lara_in_process(["deployment-report", "--arms", arms[0], arms[0], "--out", tmp_path / "r2.csv"])
    assert rc != 0 and "same file" in err
    rc, _, err = lara_in_process(["deploy-arms", "--candidates", tmp_path / "control" / "stream.parquet",
                                  "--lambda-json", tmp_path / "lambda.json", "--online",
                                  tmp_path / "heavy" / "online_0.05.parquet", "--settings", settings,
                                  "--out", tmp_path / "x.csv", "--trace", tmp_path / "x.parquet"])
    assert rc != 0 and "online_0.05.parquet" in err and "another scenario" in err
    rc, _, err = lara_in_process(["online", "--candidates", tmp_path / "control" / "stream.parquet", "--lambda-json",
                                  tmp_path / "lambda.json", "--settings", settings, "--tau", "-0.2", "--out",
                                  tmp_path / "o.parquet", "--record", tmp_path / "o.json"])
    assert rc != 0 and "tau" in err and not (tmp_path / "o.parquet").exists()
    statements_only_about_what_exists(tmp_path, settings, arms)


def statements_only_about_what_exists(tmp_path, settings, arms):
    """A window longer than the stream, a cap below lambda*, settings other than the stream's, an online run's
    certificate for another window or batch, a verdict edited by hand, one stream under two names, two lambda
    records in one report: refused, naming the input or key, nothing written."""
    stream, control = tmp_path / "control" / "stream.parquet", tmp_path / "control"
    base = ["--candidates", stream, "--lambda-json", tmp_path / "lambda.json", "--settings", settings]
    online_out = ["--out", tmp_path / "o.parquet", "--record", tmp_path / "o.json"]
    for extra, says in ((["--window", "401"], "deployment.window: 401 visits, but deployment.stream_length is 400"),
                        (["--lambda-cap", "0.05"], "deployment.lambda_cap: 0.05 is below lambda* = 0.1"),
                        (["--stream-length", "5000"], "deployment.stream_length: 5000, but --candidates"),
                        (["--bon-n", "3"], "decode.bon_n: 3, but --candidates")):
        rc, _, err = lara_in_process(["online", *base, *extra, *online_out])
        assert rc == 2 and says in err and not (tmp_path / "o.parquet").exists(), err
    arms_out = ["--out", tmp_path / "a.csv", "--trace", tmp_path / "t.parquet"]
    for extra, says in ((["--window", "50"], "its certificate is stated for windows of 100 visits"),
                        (["--batch-size", "2", "--window", "100"], "run with batch_size 1"),
                        (["--lambda-cap", "1.1"], "run with lambda_cap None")):
        rc, _, err = lara_in_process(["deploy-arms", *base, "--online", control / "online_0.05.parquet", *extra,
                                      *arms_out])
        assert rc == 2 and says in err and not (tmp_path / "a.csv").exists(), err
    table = pd.read_csv(arms[0])
    fixed = table.index[table.arm == "fixed_star"][0]
    edited = table.assign(met=table.met.where(table.index != fixed, not table.loc[fixed, "met"]))
    edited.to_csv(tmp_path / "edited.csv", index=False)
    rc, _, err = lara_in_process(["deployment-report", "--arms", tmp_path / "edited.csv", arms[1], "--out",
                                  tmp_path / "r.csv"])
    assert rc == 2 and "arm fixed_star: met" in err and "edited by hand" in err, err
    table.assign(scenario="renamed").to_csv(tmp_path / "renamed.csv", index=False)
    rc, _, err = lara_in_process(["deployment-report", "--arms", arms[0], tmp_path / "renamed.csv", "--out",
                                  tmp_path / "r.csv"])
    assert rc == 2 and "the same stream as" in err, err
    pd.read_csv(arms[1]).assign(lambda_record="0123456789abcdef").to_csv(tmp_path / "other.csv", index=False)
    rc, _, err = lara_in_process(["deployment-report", "--arms", arms[0], tmp_path / "other.csv", "--out",
                                  tmp_path / "r.csv"])
    assert rc == 2 and "made with another lambda record" in err and not (tmp_path / "r.csv").exists(), err


BAD_STREAMS = {
    "a missing visit": (lambda df: df[df.t != 3], "t = 3 is missing"),
    "two prompts in a visit": (lambda df: df.assign(prompt_id=np.where(df.index == 1, "other", df.prompt_id)),
                               "mixes candidates of two prompts"),
    "a sample twice": (lambda df: df.assign(sample_id=np.where(df.index == 1, df.sample_id.shift(1), df.sample_id)),
                       "lists sample"),
    "a NaN cost": (lambda df: df.assign(cost=np.where(df.index == 5, np.nan, df.cost)), "cost"),
    "an uneven visit": (lambda df: df.drop(index=2), "candidates, visit 0 has"),
}


@pytest.mark.parametrize("name", BAD_STREAMS)
def test_a_bad_stream_is_refused_naming_the_file(tmp_path, name):
    change, message = BAD_STREAMS[name]
    visits = pd.DataFrame({"t": np.repeat(np.arange(6), 3), "prompt_id": np.repeat([f"p{i}" for i in range(6)], 3),
                           "sample_id": np.tile(np.arange(3), 6), "reward": np.arange(18.0), "cost": -np.arange(18.0)})
    change(visits).to_parquet(tmp_path / "s.parquet")
    from lara.deploy.online import read_stream

    with pytest.raises(DataError, match=message) as err:
        read_stream(tmp_path / "s.parquet")
    assert "s.parquet" in str(err.value)


def test_the_pool_refuses_calibration_prompts_unknown_strata_and_two_strata_for_one_prompt(tmp_path):
    pd.DataFrame({"prompt_id": ["c1"], "prompt": ["a calibration prompt"]}).to_parquet(tmp_path / "cal.parquet")
    cases = {"calibration prompt": [("a  calibration prompt", "benign"), ("x", "harmful")],
             "a stratum is one of": [("x", "sometimes"), ("y", "benign")],
             "two strata": [("x", "benign"), ("x", "harmful")]}
    for message, rows in cases.items():
        pd.DataFrame(rows, columns=["prompt", "stratum"]).to_json(tmp_path / "p.jsonl", orient="records", lines=True)
        rc, _, err = lara_in_process(["deployment-pool", "--source", tmp_path / "p.jsonl", "--calibration",
                                      tmp_path / "cal.parquet", "--out", tmp_path / "out.parquet"])
        assert rc != 0 and message in err and "p.jsonl" in err, err
        assert not (tmp_path / "out.parquet").exists()


def test_scenarios_are_named_once_and_an_overlay_can_turn_the_stage_off(tmp_path):
    from lara import config as lara_config

    two = {"deployment": {"scenarios": [{"name": "a"}, {"name": "a", "harmful_share": 0.9}]}}
    with pytest.raises(ConfigError, match="'a' is given twice"):
        lara_config.scenarios(two)
    one = {"deployment": {"scenarios": [{"name": "drift", "harmful_share": [0.5, 1.0]}]}}
    assert lara_config.scenarios(one) == {"drift": {"harmful_share": [0.5, 1.0]}}
    (tmp_path / "off.yaml").write_text("deployment:\n  scenarios: []\n")
    resolved = lara_config.load(Path(__file__).parents[2] / "config/config.yaml", tmp_path / "off.yaml")
    assert resolved["deployment"]["scenarios"] == [] and lara_config.scenarios(resolved) == {}
