"""`lara figure --kind constraints` (lara.evaluate.figures): the vector lambda of several constraints drawn from
`lara calibrate-vector`'s record and the calibration scores it was made from, on synthetic files written the way
the steps write them. Two constraints: the feasible region in (lambda_1, lambda_2), its shaded grid points exactly
those where the exact expected Best-of-N cost vector meets every tau; any other number: the costs along the ray."""

from __future__ import annotations

import json
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from lara import identity
from lara.calibrate.bestofn import expected
from lara.calibrate.calibrate import CalibrationSettings
from lara.calibrate.vector import combined, expected_vector
from lara.cli import main
from lara.constraints import spec
from lara.constraints.calibrate import load_vector_scores, vector_calibrate
from lara.data.tables import write_table
from lara.evaluate import figures
from lara.io import write_json

PROMPTS, K, N = 40, 6, 4


def settings(taus) -> CalibrationSettings:
    return CalibrationSettings(tau=float(taus[0]), bootstrap=200, quantile=0.9, bon_n=N, lambda_search_max=5.0,
                               seed=3, cost_bounds=[-4.0, 4.0])


def write_inputs(root, taus, seed: int = 0):
    """results/x/constraints/{calibration_scores.parquet, lambda.json} and results/x/settings.tsv, stamped as
    lara score-constraints and lara calibrate-vector stamp them; returns their paths and the --constraints JSON."""
    rng = np.random.default_rng(seed)
    m = len(taus)
    costs = rng.normal(0.0, 1.0, (PROMPTS, K, m))
    reward = costs.sum(axis=2) * 0.6 + rng.normal(0.0, 0.5, (PROMPTS, K))
    cons = [spec.Constraint(f"c{j}", f"category:c{j}", float(t)) for j, t in enumerate(taus)]
    df = pd.DataFrame({"prompt_id": np.repeat([f"p{i}" for i in range(PROMPTS)], K),
                       "sample_id": np.tile(np.arange(K), PROMPTS), "reward": reward.ravel()}
                      | {c.column: costs[..., j].ravel() for j, c in enumerate(cons)})
    out = root / "results" / "x"
    scores_path = out / "constraints" / "calibration_scores.parquet"
    made = identity.stamp("constraint_scores", scores_path, role="calibration", constraints=[c.name for c in cons])
    write_table(df, scores_path, {"reward": "reward", "costs": {c.name: c.cost for c in cons},
                                  "constraints": spec.to_json(cons), identity.KEY: made})
    s = settings(taus)
    result = vector_calibrate(load_vector_scores(scores_path, cons), cons, s)
    lam_path = out / "constraints" / "lambda.json"
    made = identity.stamp("lambda_vector", lam_path, role="calibration", tau=result["tau"], names=result["names"],
                          procedure=s.guarantee, decoder=result["decoder"], made_from={"--scores": scores_path})
    write_json(lam_path, result | {"settings": asdict(s), identity.KEY: made})
    table = out / "settings.tsv"
    table.write_text("key\tvalue\torigin\nexperiment\tx\tconfig\n")
    return lam_path, scores_path, table, spec.to_json(cons)


def draw(tmp_path, lam, scores, table, cons):
    return main(["figure", "--kind", "constraints", "--lambda-json", str(lam), "--scores", str(scores),
                 "--constraints", cons, "--experiment-settings", str(table), "--rule", "figure_constraints",
                 "--png", str(tmp_path / "f.png"), "--pdf", str(tmp_path / "f.pdf"),
                 "--provenance", str(tmp_path / "f.provenance.json")])


def drawn(tmp_path, inputs) -> dict:
    for ext in ("png", "pdf"):
        assert (tmp_path / f"f.{ext}").stat().st_size > 0
    side = json.loads((tmp_path / "f.provenance.json").read_text())
    assert set(side["inputs"]) == {str(p) for p in inputs}
    assert side["rule"] == "figure_constraints" and side["params"]["kind"] == "constraints"
    return side["shows"]


def test_two_constraints_draw_the_feasible_region(tmp_path):
    lam, scores, table, cons = write_inputs(tmp_path, (0.0, 0.05))
    assert draw(tmp_path, lam, scores, table, cons) in (0, None)
    shows = drawn(tmp_path, (lam, scores, table))
    record = json.loads(lam.read_text())
    assert shows["kind"] == "constraints" and shows["view"] == "region"
    assert shows["constraints"] == [{"name": "c0", "tau": 0.0}, {"name": "c1", "tau": 0.05}]
    assert shows["n"] == N and shows["calibration_prompts"] == PROMPTS and shows["deployed"] == "bootstrap"
    assert shows["grid"]["points"] == figures.GRID_POINTS
    assert shows["grid"]["top"] == pytest.approx(record["brute_force"]["top"], abs=1e-4)
    assert 0 < shows["grid"]["feasible_points"] < shows["grid"]["total"] == figures.GRID_POINTS ** 2
    assert {"hat", "bootstrap", "soft", "ltt", "brute_force"} <= set(shows["procedures"])
    # each procedure's exact reward and costs: the record's brute-force check computed the same numbers
    for name in ("hat", "bootstrap", "soft"):
        got, want = shows["procedures"][name], record["brute_force"][name]
        assert got["reward"] == pytest.approx(want["reward"], abs=1e-4)
        assert got["cost"] == pytest.approx(want["cost"], abs=1e-4) and got["meets_tau"] == want["feasible"]
    assert shows["procedures"]["brute_force"]["reward"] == pytest.approx(record["brute_force"]["best"]["reward"],
                                                                         abs=1e-4)


def test_the_shaded_grid_points_are_where_expected_vector_meets_every_tau(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import QuadMesh

    taus = (0.0, 0.05)
    lam, scores_path, _, cons = write_inputs(tmp_path, taus)
    record, scores = figures.read_vector_inputs(str(lam), str(scores_path), cons)
    top = 1.5
    grid = figures.constraint_grid(scores, taus, N, top, points=13)
    axis = np.linspace(0.0, top, 13)
    slack = 1e-12 * np.maximum(1.0, np.abs(taus))
    for i2, b in enumerate(axis):
        for i1, a in enumerate(axis):
            cost = expected_vector(scores.reward, scores.costs, scores.mask, [a, b], N).mean(axis=0)
            reward = expected(scores.reward, combined(scores.costs, [a, b]), scores.mask, [1.0], N,
                              scores.reward)[0, :, 0].mean()
            assert grid.feasible[i2, i1] == bool(np.all(cost <= np.asarray(taus) + slack)), (a, b)
            assert np.allclose(grid.costs[i2, i1], cost, rtol=0, atol=1e-12)
            assert grid.reward[i2, i1] == pytest.approx(reward, abs=1e-12)
    assert grid.feasible.any() and not grid.feasible.all()
    # the figure shades exactly those points: one cell per grid point, masked where a constraint is missed
    view = figures.constraint_view(record, scores)
    fig = figures.constraints(view, record, figures.FigureSettings())
    mesh = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]
    assert len(mesh) == 1
    shaded = ~np.ma.getmaskarray(mesh[0].get_array()).reshape(view.grid.feasible.shape)
    assert np.array_equal(shaded, view.grid.feasible)
    l1, l2 = view.grid.lambdas
    want = np.array([np.all(expected_vector(scores.reward, scores.costs, scores.mask, [a, b], N).mean(axis=0)
                            <= np.asarray(taus) + slack) for a, b in zip(l1.ravel(), l2.ravel(), strict=True)])
    assert np.array_equal(view.grid.feasible.ravel(), want)


def test_one_constraint_draws_its_cost_along_lambda(tmp_path):
    lam, scores, table, cons = write_inputs(tmp_path, (-0.3,))
    assert draw(tmp_path, lam, scores, table, cons) in (0, None)
    shows = drawn(tmp_path, (lam, scores, table))
    assert shows["view"] == "ray" and shows["constraints"] == [{"name": "c0", "tau": -0.3}]
    assert shows["direction"] == [1.0] and "brute_force" not in shows["procedures"]
    record = json.loads(lam.read_text())
    assert shows["procedures"]["hat"]["lambda"] == [round(record["lambda_hat"][0], 4)]
    assert shows["procedures"]["hat"]["meets_tau"] and shows["procedures"]["hat"]["on_ray"]


def test_three_constraints_draw_their_costs_along_the_ray(tmp_path):
    taus = (0.0, 0.1, 0.0)
    lam, scores_path, table, cons = write_inputs(tmp_path, taus)
    assert draw(tmp_path, lam, scores_path, table, cons) in (0, None)
    shows = drawn(tmp_path, (lam, scores_path, table))
    assert shows["view"] == "ray" and [c["name"] for c in shows["constraints"]] == ["c0", "c1", "c2"]
    # the path drawn is the exact expected cost vector at s d, and every procedure on the ray sits at its own s
    record, scores = figures.read_vector_inputs(str(lam), str(scores_path), cons)
    view = figures.constraint_view(record, scores)
    d = np.asarray(record["direction"])
    for t in range(0, len(view.ray["s"]), 50):
        s = view.ray["s"][t]
        want = expected_vector(scores.reward, scores.costs, scores.mask, s * d, N).mean(axis=0)
        assert np.allclose(view.ray["costs"][t], want, atol=1e-9)
    for name in ("hat", "bootstrap", "soft"):
        p = view.procedures[name]
        assert p["on_ray"] and p["s"] in view.ray["s"]
        assert np.allclose(view.ray["costs"][list(view.ray["s"]).index(p["s"])], p["cost"], atol=1e-9)
    assert view.procedures["hat"]["meets_tau"]


def test_scores_the_record_was_not_calibrated_on_are_refused(tmp_path, capsys):
    lam, scores, table, cons = write_inputs(tmp_path, (0.0, 0.05))
    _, other, _, _ = write_inputs(tmp_path / "other", (0.0, 0.05), seed=1)
    assert draw(tmp_path, lam, other, table, cons) == 2
    assert f"--scores {other}: not the scores --lambda-json {lam} was calibrated on" in capsys.readouterr().err
    assert not list(tmp_path.glob("f.*"))
    moved = spec.to_json([spec.Constraint("c0", "category:c0", 0.0), spec.Constraint("c1", "category:c1", 0.2)])
    assert draw(tmp_path, lam, scores, table, moved) == 2
    assert "calibrated for tau [0.0, 0.05]" in capsys.readouterr().err
    assert main(["figure", "--kind", "constraints", "--lambda-json", str(lam), "--png", str(tmp_path / "f.png"),
                 "--pdf", str(tmp_path / "f.pdf"), "--provenance", str(tmp_path / "f.provenance.json")]) == 2
    assert "figure constraints needs --scores, --constraints" in capsys.readouterr().err
