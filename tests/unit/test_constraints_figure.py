"""`lara figure --kind constraints` (lara.evaluate.figures): the vector lambda of several constraints drawn from
`lara calibrate-vector`'s record and the calibration scores it was made from, on synthetic files written the way
the steps write them. Two constraints: the feasible region in (lambda_1, lambda_2), its shaded grid points exactly
those where the exact expected Best-of-N cost vector meets every tau; any other number: the costs along the ray.
`--kind constraints_sweep` (Fig. 1 per constraint): the held-out test candidates' Best-of-N pick along the ray with
lara audit-constraints' audit of synthetic decoded outputs, and the audits and pools that do not belong refused."""

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
from lara.evaluate.figures import FigureSettings
from lara.evaluate.figures.constraints import (
    GRID_POINTS,
    constraint_grid,
    constraint_view,
    constraints,
    read_vector_inputs,
)
from lara.evaluate.figures.constraints_sweep import constraints_sweep, read_sweep_audit, sweep_view
from lara.io import write_json
from lara.read.files import write_table

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
    assert shows["grid"]["points"] == GRID_POINTS
    assert shows["grid"]["top"] == pytest.approx(record["brute_force"]["top"], abs=1e-4)
    assert 0 < shows["grid"]["feasible_points"] < shows["grid"]["total"] == GRID_POINTS ** 2
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
    record, scores = read_vector_inputs(str(lam), str(scores_path), cons)
    top = 1.5
    grid = constraint_grid(scores, taus, N, top, points=13)
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
    view = constraint_view(record, scores)
    fig = constraints(view, record, FigureSettings())
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
    record, scores = read_vector_inputs(str(lam), str(scores_path), cons)
    view = constraint_view(record, scores)
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


# -- constraints_sweep: Fig. 1 per constraint, the vector lambda's decoder on the held-out test prompts ---------

TEST_PROMPTS = 30  # at least lara.stats.MIN_PROMPTS, so the audit gives verdicts
SWEEP_TAUS = (0.0, 0.05)


def scores_frame(rng, prefix: str, prompts: int, k: int, m: int, texts: str | None = None) -> pd.DataFrame:
    """Scored samples as lara score-constraints writes them: prompt_id, prompt, sample_id, response, reward and
    cost_c<j> (the reward rises with the costs: a penalty has something to trade)."""
    costs = rng.normal(0.0, 1.0, (prompts, k, m))
    reward = costs.sum(axis=2) * 0.6 + rng.normal(0.0, 0.5, (prompts, k))
    df = pd.DataFrame({"prompt_id": np.repeat([f"{prefix}{i}" for i in range(prompts)], k),
                       "prompt": np.repeat([f"{texts or prefix} prompt number {i}" for i in range(prompts)], k),
                       "sample_id": np.tile(np.arange(k), prompts), "reward": reward.ravel()}
                      | {f"cost_c{j}": costs[..., j].ravel() for j in range(m)})
    df["response"] = [f"response {i}" for i in range(len(df))]
    return df


def write_scores(df: pd.DataFrame, path, cons, role: str) -> None:
    made = identity.stamp("constraint_scores", path, role=role, constraints=[c.name for c in cons],
                          prompts=identity.prompt_set(df, str(path)).record())
    write_table(df, path, {"reward": "reward", "costs": {c.name: c.cost for c in cons},
                           "constraints": spec.to_json(cons), identity.KEY: made})


def decoded_bon(candidates: pd.DataFrame, scores, record, setting: str) -> pd.DataFrame:
    """lara decode-vector --method bon: the picked candidate per prompt (its rows in from_long's layout)."""
    from lara.constraints.decode import resolve_vector, select_vector

    lam = resolve_vector(setting, record, scores.costs.shape[2])
    pick = select_vector(scores.reward, scores.costs, lam)
    order = np.argsort(candidates["prompt_id"].to_numpy(), kind="stable")
    rows = order.reshape(len(scores.prompt_ids), N)[np.arange(len(pick)), pick]
    return candidates.iloc[rows].reset_index(drop=True).assign(method="bon", setting=setting, lambda_=json.dumps(lam))


def write_audit(path, outputs: list[pd.DataFrame], cons, record: dict, lam_path, **changes) -> None:
    """lara audit-constraints' audit.json from decoded outputs already scored (the decoding reward and costs are
    the candidates' own: the same scorers), each constraint's evaluation score a noisy copy."""
    from lara.constraints.audit import audit

    rng = np.random.default_rng(5)
    scored = [df.rename(columns={"lambda_": "lambda"}).assign(**{f"eval_{c.name}": df[c.column] + rng.normal(
        0.0, 0.1, len(df)) for c in cons}) for df in outputs]
    table, joint = audit(scored, cons, 200, 0)
    made = identity.stamp("audit_constraints", path, names=[c.name for c in cons], tau=record["tau"],
                          lambda_record=identity.file_digest(lam_path),
                          prompts=identity.prompt_set(outputs[0], str(path), per_prompt=1).record(),
                          made_from={"--lambda-json": lam_path})
    write_json(path, {"constraints": record["constraints"], "lambda_hat": record["lambda_hat"],
                      "lambda_star": record["lambda_star"], "procedure": record["guarantee"]["procedure"],
                      "rows": json.loads(table.to_json(orient="records")), "joint": joint,
                      identity.KEY: made | changes})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """results/x/constraints/{calibration_scores, bon_scores}.parquet, lambda.json, audit.json (Best-of-N at zero,
    hat, star, ltt; ARGS at zero and star) and results/x/settings.tsv, as the steps write them."""
    from lara.constraints.decode import resolve_vector

    root = tmp_path_factory.mktemp("sweep") / "results" / "x"
    rng = np.random.default_rng(11)
    m = len(SWEEP_TAUS)
    cons = [spec.Constraint(f"c{j}", f"category:c{j}", float(t)) for j, t in enumerate(SWEEP_TAUS)]
    cal = root / "constraints" / "calibration_scores.parquet"
    write_scores(scores_frame(rng, "p", PROMPTS, K, m), cal, cons, "calibration")
    s = settings(SWEEP_TAUS)
    cal_scores = load_vector_scores(cal, cons)
    result = vector_calibrate(cal_scores, cons, s)
    lam_path = root / "constraints" / "lambda.json"
    made = identity.stamp("lambda_vector", lam_path, role="calibration", tau=result["tau"], names=result["names"],
                          procedure=s.guarantee, decoder=result["decoder"],
                          prompts=cal_scores.prompts.record(with_keys=True), made_from={"--scores": cal})
    record = result | {"settings": asdict(s), identity.KEY: made}
    write_json(lam_path, record)
    record = json.loads(lam_path.read_text())
    candidates = scores_frame(rng, "t", TEST_PROMPTS, N, m)
    bon = root / "constraints" / "bon_scores.parquet"
    write_scores(candidates, bon, cons, "test")
    test = load_vector_scores(bon, cons)
    # an LTT that certified nothing is never decoded under its name (lara.constraints.decode.resolve_vector)
    certified = record["procedures"]["ltt"].get("feasible") is not False
    outputs = [decoded_bon(candidates, test, record, setting)
               for setting in ("zero", "hat", "star", *(("ltt",) if certified else ()))]
    for setting in ("zero", "star"):  # ARGS: one response per prompt, scored
        lam = resolve_vector(setting, record, m)
        outputs.append(scores_frame(rng, "t", TEST_PROMPTS, 1, m).assign(method="args", setting=setting,
                                                                         lambda_=json.dumps(lam)))
    audit_path = root / "constraints" / "audit.json"
    write_audit(audit_path, outputs, cons, record, lam_path)
    table = root / "settings.tsv"
    table.write_text("key\tvalue\torigin\nexperiment\tx\tconfig\n")
    return {"lam": lam_path, "cal": cal, "bon": bon, "audit": audit_path, "settings": table,
            "cons": spec.to_json(cons), "constraints": cons, "record": record, "test": test, "outputs": outputs,
            "candidates": candidates}


def draw_sweep(out, sweep, **given):
    paths = {"lambda-json": sweep["lam"], "scores": sweep["bon"], "audit": sweep["audit"],
             "constraints": sweep["cons"]} | given
    argv = ["figure", "--kind", "constraints_sweep", "--experiment-settings", str(sweep["settings"]),
            "--rule", "figure_constraints_sweep", "--png", str(out / "f.png"), "--pdf", str(out / "f.pdf"),
            "--provenance", str(out / "f.provenance.json")]
    for flag, value in paths.items():
        if value is not None:
            argv += [f"--{flag}", str(value)]
    return main(argv)


def picked_mean(scores, lam) -> tuple[float, np.ndarray]:
    """The mean reward and cost vector of the candidate maximising r - lam.c per prompt (no ties in these data)."""
    pick = np.argmax(scores.reward - combined(scores.costs, lam), axis=1)
    rows = np.arange(len(pick))
    return float(scores.reward[rows, pick].mean()), scores.costs[rows, pick].mean(axis=0)


def test_constraints_sweep_draws_fig1_per_constraint(tmp_path, sweep):
    assert draw_sweep(tmp_path, sweep) in (0, None)
    for ext in ("png", "pdf"):
        assert (tmp_path / f"f.{ext}").stat().st_size > 0
    side = json.loads((tmp_path / "f.provenance.json").read_text())
    assert set(side["inputs"]) == {str(sweep[k]) for k in ("lam", "bon", "audit", "settings")}
    assert side["rule"] == "figure_constraints_sweep" and side["params"]["kind"] == "constraints_sweep"
    shows, record, test = side["shows"], sweep["record"], sweep["test"]
    assert shows["constraints"] == [{"name": "c0", "tau": 0.0}, {"name": "c1", "tau": 0.05}]
    assert shows["n"] == N and shows["test_prompts"] == TEST_PROMPTS and shows["deployed"] == "bootstrap"
    assert shows["audit"]["lambda_record"] == identity.file_digest(sweep["lam"])
    # lambda-hat and lambda* lie on the ray, at s = max(lambda) / max(d); the decoder there is the pick's mean
    d = np.asarray(record["direction"])
    for key, field in (("hat", "lambda_hat"), ("star", "lambda_star")):
        mark = shows["marks"][key]
        assert mark["on_ray"] and mark["s"] == pytest.approx(max(record[field]) / d.max(), abs=1e-4)
        reward, cost = picked_mean(test, record[field])
        assert mark["cost"] == pytest.approx(cost, abs=1e-4) and mark["reward"] == pytest.approx(reward, abs=1e-4)
    got = {(a["method"], a["setting"]): a for a in shows["audited"]}
    certified = record["procedures"]["ltt"].get("feasible") is not False
    assert set(got) == {("bon", "zero"), ("bon", "hat"), ("bon", "star"), ("args", "zero"),
                        ("args", "star")} | ({("bon", "ltt")} if certified else set())
    assert got["bon", "zero"]["s"] == 0 and got["bon", "star"]["s"] == shows["marks"]["star"]["s"]
    if certified:
        ltt = np.asarray(record["procedures"]["ltt"]["lambda"])
        on = np.allclose(ltt, ltt.max() / d.max() * d, rtol=0, atol=1e-9)
        assert got["bon", "ltt"]["on_ray"] == on and got["bon", "ltt"]["lambda"] == pytest.approx(ltt, abs=1e-4)
    # the audited Best-of-N outputs are the pick (the same scorers; audit.json holds 10 digits: pandas' to_json),
    # and the pick is the exact expected path
    assert shows["checks"]["bon_audit_vs_pick"] < 1e-8 and shows["checks"]["pick_vs_exact_path"] < 1e-12
    assert all(a["joint"] != "not audited" for a in shows["audited"])


def test_the_curve_is_the_picked_candidates_mean_cost(sweep):
    import matplotlib

    matplotlib.use("Agg")
    record, test = sweep["record"], sweep["test"]
    _, scores = read_vector_inputs(str(sweep["lam"]), str(sweep["bon"]), sweep["cons"], held_out=True)
    audit = read_sweep_audit(str(sweep["audit"]), str(sweep["lam"]), record, scores.prompts)
    view = sweep_view(record, scores, audit)
    fig = constraints_sweep(view, FigureSettings())
    d = np.asarray(record["direction"])
    curves = {line.get_gid(): line for ax in fig.axes for line in ax.get_lines()
              if str(line.get_gid()).startswith("curve:")}
    assert set(curves) == {"curve:c0", "curve:c1", "curve:reward"}
    x = np.asarray(curves["curve:c0"].get_xdata())
    assert x[0] == 0 and x[-1] == pytest.approx(view.curve["s_max"]) and view.marks["hat"]["s"] in x
    rng = np.random.default_rng(0)
    # at drawn points (the first, lambda-hat's, a few others) and anywhere between two (the step holds: exact)
    at = [0, int(np.searchsorted(x, view.marks["hat"]["s"])), len(x) // 3, len(x) - 1, *rng.integers(0, len(x), 4)]
    between = rng.uniform(0.0, x[-1], 6)
    for s, i in [(x[i], i) for i in at] + [(s, int(np.searchsorted(x, s, side="right")) - 1) for s in between]:
        reward, cost = picked_mean(test, s * d)
        want = expected_vector(test.reward, test.costs, test.mask, s * d, N).mean(axis=0)
        assert np.allclose(cost, want, rtol=0, atol=1e-12)
        for j in range(2):
            assert curves[f"curve:c{j}"].get_ydata()[i] == pytest.approx(cost[j], abs=1e-12), (s, j)
        assert curves["curve:reward"].get_ydata()[i] == pytest.approx(reward, abs=1e-12), s
    # each audited Best-of-N output sits on the curve at its s (an output on the ray)
    for a in view.audited:
        if a["method"] == "bon" and a["on_ray"] and a["s"] <= view.curve["s_max"]:
            i = int(np.searchsorted(x, a["s"]))
            assert x[i] == a["s"] and np.allclose(a["cost"], view.curve["costs"][i], rtol=0, atol=1e-8)
    # and tau is drawn in each cost panel
    for j, tau in enumerate(SWEEP_TAUS):
        assert any(np.allclose(line.get_ydata(), tau) for line in fig.axes[j].get_lines()
                   if line.get_linestyle() == "--")


def test_a_mismatched_audit_or_pool_is_refused(tmp_path, sweep, capsys):
    from lara.constraints.decode import resolve_vector

    cons, record = sweep["constraints"], sweep["record"]
    bad = tmp_path / "audit.json"
    # made with another record
    write_audit(bad, sweep["outputs"], cons, record, sweep["lam"], lambda_record="0" * 16)
    assert draw_sweep(tmp_path, sweep, audit=bad) == 2
    err = capsys.readouterr().err
    assert f"--audit {bad}: does not belong to --lambda-json {sweep['lam']}" in err
    assert "made with another lambda record (digest 0000000000000000" in err
    # for other constraints
    other = [cons[0], spec.Constraint("c9", "category:c9", 0.05)]
    renamed = [df.rename(columns={"cost_c1": "cost_c9"}) for df in sweep["outputs"]]
    write_audit(bad, renamed, other, record | {"constraints": [asdict(c) for c in other]}, sweep["lam"])
    assert draw_sweep(tmp_path, sweep, audit=bad) == 2
    assert "name the constraints ['c0', 'c9'], the record's are ['c0', 'c1']" in capsys.readouterr().err
    # an output decoded at another lambda than the record's star
    moved = [df.assign(lambda_=json.dumps([2.0 * x for x in resolve_vector("star", record, 2)]))
             if (df["method"].iloc[0], df["setting"].iloc[0]) == ("bon", "star") else df for df in sweep["outputs"]]
    write_audit(bad, moved, cons, record, sweep["lam"])
    assert draw_sweep(tmp_path, sweep, audit=bad) == 2
    assert "bon/star was audited at lambda" in capsys.readouterr().err
    # on another test pool: smaller (its identity names the prompts; a hand-written one still has its counts)
    fewer = [df.iloc[:-2] for df in sweep["outputs"]]
    write_audit(bad, fewer, cons, record, sweep["lam"])
    assert draw_sweep(tmp_path, sweep, audit=bad) == 2
    assert f"audited on other test prompts ({TEST_PROMPTS - 2} prompts" in capsys.readouterr().err
    write_audit(bad, fewer, cons, record, sweep["lam"], prompts=None)
    assert draw_sweep(tmp_path, sweep, audit=bad) == 2
    assert f"audited on {TEST_PROMPTS - 2} test prompts, but --scores covers {TEST_PROMPTS}" in capsys.readouterr().err
    # as large, other prompts
    swapped = [df.assign(prompt="another " + df["prompt"].astype(str)) for df in sweep["outputs"]]
    write_audit(bad, swapped, cons, record, sweep["lam"])
    assert draw_sweep(tmp_path, sweep, audit=bad) == 2
    assert f"audited on other test prompts ({TEST_PROMPTS} prompts" in capsys.readouterr().err
    # the calibration scores, and test candidates that are calibration prompts
    assert draw_sweep(tmp_path, sweep, scores=sweep["cal"]) == 2
    assert "role calibration, expected test" in capsys.readouterr().err
    leak = tmp_path / "bon_scores.parquet"
    write_scores(scores_frame(np.random.default_rng(1), "t", TEST_PROMPTS, N, 2, texts="p"), leak, cons, "test")
    assert draw_sweep(tmp_path, sweep, scores=leak) == 2
    assert f"of its prompts are calibration prompts of --lambda-json {sweep['lam']}" in capsys.readouterr().err
    assert draw_sweep(tmp_path, sweep, audit=None) == 2
    assert "figure constraints_sweep needs --audit" in capsys.readouterr().err
    assert not list(tmp_path.glob("f.*"))
