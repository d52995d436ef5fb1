"""``lara coverage-vector``: the coverage study of the vector lambda on a synthetic population whose truth is exact.
LTT's joint violation rate stays within delta, the joint rate is never below a single constraint's, the
population's own lambda meets every tau exactly and is the first point of its ray that does, one constraint is the
scalar study itself, and the command reads constraint-score tables, writes its record and table, and refuses bad
input naming the file."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import lara.constraints.calibrate as vector_calibration
from lara.calibrate.calibrate import CalibrationSettings
from lara.calibrate.coverage import CoverageSettings
from lara.calibrate.coverage import study as scalar_study
from lara.calibrate.dual import PromptScores
from lara.calibrate.vector import expected_vector, first_feasible, ray_path
from lara.config import ConfigError
from lara.constraints.calibrate import VectorScores
from lara.constraints.coverage import load_population, population_at, study
from lara.constraints.spec import Constraint, to_json
from lara.read.files import DataError

DELTA = 0.2


@pytest.fixture(autouse=True)
def coarse_ltt_grid(monkeypatch):
    """LTT's grid of s is fixed before the data (any fixed grid keeps its guarantee); a coarse one keeps the tests
    fast."""
    monkeypatch.setattr(vector_calibration, "LTT_GRID", 201)


def world(seed: int, prompts: int = 300, k: int = 4, m: int = 2) -> VectorScores:
    """Costs in [0, 1] (the cost bounds, so LTT's guarantee is about the costs themselves), the reward rising
    with every cost: each constraint binds at lambda = 0."""
    rng = np.random.default_rng(seed)
    costs = rng.uniform(0.0, 1.0, (prompts, k, m))
    reward = 1.5 * costs.sum(axis=2) + rng.normal(0.0, 0.5, (prompts, k))
    return VectorScores(reward, costs, np.ones((prompts, k), dtype=bool), np.arange(prompts))


def constraints(*taus) -> list[Constraint]:
    return [Constraint(name, f"category:{name}", t) for name, t in zip("ab", taus, strict=False)]


def both(repeats=40, n_prompts=(80,), bootstrap=50, **kw):
    """The study's and the calibration's settings, their shared values (one config key each) equal."""
    common = dict(tau=0.5, quantile=0.9, delta=DELTA, cost_bounds=[0.0, 1.0], lambda_search_max=10.0, bon_n=4,
                  seed=0) | kw
    return (CalibrationSettings(**common, bootstrap=10000),
            CoverageSettings(**common, repeats=repeats, n_prompts=list(n_prompts), bootstrap=bootstrap))


@pytest.fixture(scope="module")
def result():
    grid, vector_calibration.LTT_GRID = vector_calibration.LTT_GRID, 201  # runs before the autouse fixture
    try:
        pop = world(1)
        return pop, study(pop, constraints(0.5, 0.5), *both())
    finally:
        vector_calibration.LTT_GRID = grid


def test_ltt_keeps_its_joint_promise(result):
    _, (record, draws) = result
    ltt = next(r for r in record["summary"] if r["procedure"] == "ltt")
    assert ltt["violation_lo"] <= DELTA  # the Clopper-Pearson interval reaches delta or below
    assert ltt["promise_consistent"] is True and record["promises"]["ltt"]["consistent"] is True
    assert record["promises"]["ltt"]["bound"] == DELTA and record["promises"]["bootstrap"]["consistent"] is None
    assert ltt["infeasible_rate"] < 0.8  # LTT certifies often enough for the rate to say something
    # an uncertified draw deploys nothing: it is never counted as a violation
    rows = draws[draws["procedure"] == "ltt"]
    assert not (rows["violated"] & ~rows["feasible"]).any()
    assert ltt["returned_miss_rate"] >= ltt["violation_rate"]


def test_the_joint_rate_is_at_least_every_single_rate(result):
    _, (record, draws) = result
    assert {r["procedure"] for r in record["summary"]} == {"hat", "bootstrap", "ltt", "ltt_wsr"}
    for r in record["summary"]:
        assert r["violation_lo"] <= r["violation_rate"] <= r["violation_hi"]
        for name in "ab":
            assert r["violation_rate"] >= r[f"violation_rate_{name}"]
    some = draws["violated_a"] | draws["violated_b"]
    assert (draws["violated"] == some).all()
    # both constraints bind: lambda-hat misses one or the other about half the time, jointly more often
    hat = next(r for r in record["summary"] if r["procedure"] == "hat")
    assert hat["violation_rate"] > max(hat["violation_rate_a"], hat["violation_rate_b"])


def test_the_population_lambda_meets_every_tau_exactly_and_first(result):
    pop, (record, draws) = result
    p = record["population"]
    tau = np.array(record["tau"])
    lam = np.array(p["lambda_pop"])
    exact = expected_vector(pop.reward, pop.costs, pop.mask, lam, 4).mean(axis=0)
    assert np.all(exact <= tau + 1e-12) and p["lambda_pop_status"] == "interior"
    np.testing.assert_array_equal(exact, p["cost_at_lambda_pop"])  # the study's evaluation is expected_vector's
    assert np.any(np.array(p["cost_at_zero"]) > tau)
    # along the population's direction, every point before lambda_pop misses some tau
    path = ray_path(pop.reward, pop.costs, pop.mask, p["direction"], 4, 10.0)
    s, t = first_feasible(path, tau)
    assert s == p["s"] and t > 0 and np.allclose(lam, s * np.array(p["direction"]))
    before = 0.5 * (path.s[t - 1] + path.s[t]) * np.array(p["direction"])
    assert np.any(expected_vector(pop.reward, pop.costs, pop.mask, before, 4).mean(axis=0) > tau)
    # each draw's population cost is the exact one at its lambda
    row = draws.iloc[len(draws) // 2]
    at = population_at(pop, np.array([[row["lambda_a"], row["lambda_b"]]]), 4, [0.0, 1.0])[0]
    assert at[0] == row["population_cost_a"] and at[1] == row["population_cost_b"] and at[4] == row[
        "population_reward"]
    assert p["reward_at_lambda_pop"] < p["reward_at_zero"]


def test_one_constraint_is_the_scalar_study():
    """With one constraint calibrate-vector runs the scalar calibration; so does the study, on the scalar
    study's draws: the same lambdas, and lambda-hat beside them."""
    pop = world(3, prompts=200, m=1)
    cal, cov = both(repeats=15, n_prompts=(40, 80), tau=0.45, delta=0.3)
    record, draws = study(pop, constraints(0.45), cal, cov)
    assert record["procedures"] == ["hat", "bootstrap", "crc", "ltt", "ltt_wsr"] and "crc" in record["promises"]
    ref, ref_draws = scalar_study(PromptScores(pop.reward, pop.costs[..., 0], pop.mask, pop.prompt_ids), cov)
    mine = draws[draws["procedure"] != "hat"].set_index(["n", "repeat", "procedure"])["lambda_a"]
    theirs = ref_draws.set_index(["n", "repeat", "procedure"])["lambda"]
    pd.testing.assert_series_equal(mine.sort_index(), theirs.sort_index(), check_names=False)
    for r in record["summary"]:
        assert r["violation_rate"] == r["violation_rate_a"]


def test_settings_given_twice_must_agree():
    pop = world(0, prompts=40)
    cal, cov = both(repeats=2, n_prompts=(10,))
    with pytest.raises(ConfigError, match=r"calibration.quantile: --settings gives 0.9 but --calibration-settings"):
        study(pop, constraints(0.5, 0.5), CalibrationSettings(**{**cal.__dict__, "quantile": 0.95}), cov)
    with pytest.raises(ConfigError, match="cost_bounds"):
        study(pop, constraints(0.5, 0.5), *both(repeats=2, n_prompts=(10,), cost_bounds=None))
    with pytest.raises(ValueError, match=r"decode.bon_n = 8 but a population prompt has only K = 4"):
        study(pop, constraints(0.5, 0.5), *both(repeats=2, n_prompts=(10,), bon_n=8))


# -- the command ----------------------------------------------------------------------------------------------


def write_scores(path, pop: VectorScores, names, first: int = 0, role: str = "calibration", scored_for=None):
    """A constraint-score table as lara score-constraints writes it (its identity included)."""
    from lara import identity
    from lara.read.files import write_table

    p, k, m = pop.costs.shape
    df = pd.DataFrame({"prompt_id": np.repeat([f"p{first + i}" for i in range(p)], k),
                       "sample_id": np.tile(np.arange(k), p), "reward": pop.reward.ravel()})
    for j, name in enumerate(names):
        df[f"cost_{name}"] = pop.costs[..., j].ravel()
    made = identity.stamp("constraint_scores", path, role=role, per_prompt=k,
                          constraints=list(scored_for or names))
    write_table(df, path, {"constraints": json.dumps(list(names)), identity.KEY: made})
    return path


def argv(tmp_path, scores, cons, cal, cov):
    return ["coverage-vector", "--scores", *map(str, scores), "--constraints", to_json(cons),
            "--calibration-settings", cal.to_json(), "--settings", cov.to_json(),
            "--out", str(tmp_path / "coverage.json"), "--table", str(tmp_path / "coverage.csv")]


def test_the_command_writes_its_record_and_table(tmp_path):
    from lara.cli import main

    cons = constraints(0.5, 0.5)
    a = write_scores(tmp_path / "calibration_scores.parquet", world(5, prompts=50), "ab")
    b = write_scores(tmp_path / "bon_scores.parquet", world(6, prompts=40), "ab", first=50, role="test")
    cal, cov = both(repeats=4, n_prompts=(20, 30), bootstrap=50)
    assert main(argv(tmp_path, [a, b], cons, cal, cov)) == 0
    record = json.loads((tmp_path / "coverage.json").read_text())
    assert record["population"]["n_prompts"] == 90 and record["names"] == ["a", "b"] and record["tau"] == [0.5, 0.5]
    assert set(record["promises"]) == {"hat", "bootstrap", "ltt", "ltt_wsr"}
    assert record["settings"]["repeats"] == 4 and record["calibration_settings"]["bootstrap"] == 10000
    assert [s["path"] for s in record["scores"]] == [str(a), str(b)]
    table = pd.read_csv(tmp_path / "coverage.csv")
    assert len(table) == 8 and sorted(set(table["n"])) == [20, 30] and (table["repeats"] == 4).all()
    for col in ("violation_rate", "violation_lo", "violation_hi", "violation_rate_a", "violation_rate_b",
                "mean_population_cost_a", "mean_population_cost_b", "mean_reward", "infeasible_rate",
                "lambda_mean_a", "lambda_hi_b"):
        assert col in table.columns
    assert (table["violation_rate"] >= table[["violation_rate_a", "violation_rate_b"]].max(axis=1)).all()


def test_bad_input_is_refused_naming_the_file(tmp_path, capsys):
    from lara.cli import main

    cons = constraints(0.5, 0.5)
    good = write_scores(tmp_path / "good.parquet", world(5, prompts=30), "ab")
    other = write_scores(tmp_path / "other.parquet", world(6, prompts=30), "ab", first=30, scored_for=["a", "c"])
    with pytest.raises(DataError, match=r"--scores .*other.parquet: constraints .* \(scored for other constraints\)"):
        load_population([good, other], cons)
    wrong = write_scores(tmp_path / "wrong.parquet", world(6, prompts=30), ["x", "y"], first=30)
    with pytest.raises(DataError, match=r"wrong.parquet: missing column\(s\) cost_a, cost_b"):
        load_population([good, wrong], cons)
    df = pd.read_parquet(good)
    df.loc[7, "cost_b"] = np.nan
    nan = tmp_path / "nan.parquet"
    df.to_parquet(nan)
    with pytest.raises(DataError, match=r"nan.parquet: column 'cost_b' holds nan, not a finite number"):
        load_population([nan], cons)
    twice = write_scores(tmp_path / "twice.parquet", world(6, prompts=30), "ab")  # the same prompt ids as good
    with pytest.raises(DataError, match="a prompt_id appears in two tables"):
        load_population([good, twice], cons)
    # through the command: exit 2, the file named, nothing written
    cal, cov = both(repeats=2, n_prompts=(10,))
    capsys.readouterr()
    assert main(argv(tmp_path, [good, nan], cons, cal, cov)) == 2
    assert "nan.parquet: column 'cost_b'" in capsys.readouterr().err
    assert not (tmp_path / "coverage.json").exists() and not (tmp_path / "coverage.csv").exists()
