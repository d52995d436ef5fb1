"""Lambda after deployment, read back (lara.evaluate.deployment_report): `lara figure --kind deployment` and the
"After deployment" section of `lara summary`, on synthetic report.csv, trace.parquet and shift.json files."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from lara.cli import main

TAU = 0.5
LAMBDA_STAR = 0.4
ARMS = ("fixed_star", "fixed_ltt", "online_eta_0p05", "oracle")
SCENARIOS = ("control", "harmful_heavy")
T, WINDOW = 200, 50
# the numbers the summary must print (mean cost, worst window, certificate, reward given up) per scenario and arm
NUMBERS = {
    ("control", "fixed_star"): (0.412, 0.47, None, 0.021),
    ("control", "fixed_ltt"): (0.301, 0.388, None, 0.097),
    ("control", "online_eta_0p05"): (0.488, 0.553, 0.871, 0.004),
    ("control", "oracle"): (0.499, 0.561, None, 0.0),
    ("harmful_heavy", "fixed_star"): (0.637, 0.702, None, -0.052),
    ("harmful_heavy", "fixed_ltt"): (0.521, 0.6, None, 0.013),
    ("harmful_heavy", "online_eta_0p05"): (0.493, 0.612, 0.845, 0.031),
    ("harmful_heavy", "oracle"): (0.497, 0.58, None, 0.0),
}
LAMBDAS = {"fixed_star": LAMBDA_STAR, "fixed_ltt": 0.9, "oracle": 0.7}
SHIFT = {"control": (0.51, 0.62, 180.2, False), "harmful_heavy": (0.83, 0.001, 41.5, True)}


def _report(root):
    rows = []
    for (scenario, arm), (cost, worst, cert, given_up) in NUMBERS.items():
        online = arm.startswith("online")
        auc, p, ess, shifted = SHIFT[scenario]
        lam = LAMBDAS.get(arm, LAMBDA_STAR)
        rows.append({"scenario": scenario, "arm": arm, "step_size": 0.05 if online else None, "batch_size": 10,
                     "T": T, "window": WINDOW, "tau": TAU, "lambda_start": lam,
                     "lambda_end": 0.95 if online else lam, "lambda_min": 0.3 if online else lam,
                     "lambda_max": 1.1 if online else lam, "mean_cost": cost, "mean_reward": 1.0 - given_up,
                     "worst_window_cost": worst, "certificate": cert, "reward_given_up": given_up,
                     "met": cost <= TAU, "window_met": worst <= TAU, "auc": auc, "p_value": p, "ess": ess,
                     "shifted": shifted, "weighted_certified": False if shifted else None})
    path = root / "deployment" / "report.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _traces(root, scenarios=SCENARIOS):
    rng = np.random.default_rng(0)
    paths = []
    for scenario in scenarios:
        frames = []
        for arm in ARMS:
            cost = rng.normal(NUMBERS.get((scenario, arm), (0.5,))[0], 0.3, T)
            lam = np.full(T, LAMBDAS.get(arm, LAMBDA_STAR))
            if arm.startswith("online"):
                lam = np.clip(LAMBDA_STAR + 0.05 * np.cumsum(cost - TAU), 0.01, 5.0)
            frames.append(pd.DataFrame({"t": np.arange(1, T + 1), "arm": arm, "lambda": lam, "cost": cost,
                                        "reward": rng.normal(1.0, 0.3, T),
                                        "mean_cost": np.cumsum(cost) / np.arange(1, T + 1)}))
        path = root / "deployment" / scenario / "trace.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pd.concat(frames).to_parquet(path)
        paths.append(str(path))
    return paths


def _shift(root, scenario):
    auc, p, ess, shifted = SHIFT[scenario]
    statement = ("deployment prompts are shifted (AUC 0.83, p 0.001): the offline guarantee does not carry over"
                 if shifted else "no shift detected: the offline guarantee carries over")
    (root / "deployment" / scenario / "shift.json").write_text(json.dumps({
        "auc": auc, "p_value": p, "ess": ess, "min_ess": 50, "shifted": shifted, "weights_usable": not shifted,
        "statement": statement, "n_calibration": 300, "n_deployment": T}))


def _figure(tmp_path, report, traces, *extra):
    return main(["figure", "--kind", "deployment", "--report", str(report), "--traces", *traces, *extra,
                 "--png", str(tmp_path / "f.png"), "--pdf", str(tmp_path / "f.pdf"),
                 "--provenance", str(tmp_path / "f.provenance.json")])


def test_the_summary_refuses_another_scenario_s_shift_check(tmp_path):
    """A shift.json beside a scenario's trace is that scenario's check: another's (copied there) is refused, whether
    or not the report carries shift columns to compare."""
    from lara import identity
    from lara.evaluate.deployment_report import read_shift
    from lara.io import write_json
    from lara.read.files import DataError

    root = tmp_path / "results" / "x"
    report = _report(root)
    (root / "deployment" / "harmful_heavy").mkdir(parents=True, exist_ok=True)
    _shift(root, "harmful_heavy")
    path = root / "deployment" / "harmful_heavy" / "shift.json"
    record = json.loads(path.read_text())
    write_json(path, record | {"identity": identity.stamp("shift_check", path, scenario="harmful_heavy")})
    rows = pd.read_csv(report).assign(auc=np.nan, p_value=np.nan, ess=np.nan)  # a report made without --shift
    control = rows[rows["scenario"] == "control"]
    with pytest.raises(DataError, match="the shift check of scenario 'harmful_heavy'"):
        read_shift(path, control, report)
    assert read_shift(path, rows[rows["scenario"] == "harmful_heavy"], report)["auc"] == 0.83  # its own: read


def test_the_deployment_figure_draws_every_scenario_and_arm(tmp_path):
    from PIL import Image

    root = tmp_path / "results" / "x"
    report, traces = _report(root), _traces(root)
    assert _figure(tmp_path, report, traces) in (0, None)
    assert (tmp_path / "f.png").stat().st_size > 0 and (tmp_path / "f.pdf").stat().st_size > 0
    assert Image.open(tmp_path / "f.png").size[0] > 500
    side = json.loads((tmp_path / "f.provenance.json").read_text())
    shows = side["shows"]
    assert shows["kind"] == "deployment" and shows["tau"] == TAU and shows["scenarios"] == list(SCENARIOS)
    assert shows["step_sizes"] == [0.05] and shows["T"] == [T] and shows["window"] == [WINDOW]
    assert "fixed lambda*" not in shows["held"]["harmful_heavy"] and "online eta=0.05" in shows["held"]["harmful_heavy"]
    assert shows["held"]["control"] == ["fixed lambda*", "fixed LTT lambda", "online eta=0.05", "oracle"]
    assert set(side["inputs"]) == {str(report), *traces}


def test_the_deployment_figure_keeps_one_colour_per_arm(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    from lara.evaluate import deployment_report as dr
    from lara.evaluate.figures import FigureSettings, deployment

    root = tmp_path / "results" / "x"
    report = dr.read_report(_report(root))
    traces = dr.read_traces(_traces(root), report, "report.csv")
    fig = deployment(report, traces, FigureSettings())
    axes = fig.axes
    assert len(axes) == 4 and [ax.get_title().split("\n")[0] for ax in axes[:2]] == list(SCENARIOS)
    colours = [[tuple(line.get_color()) if not isinstance(line.get_color(), str) else line.get_color()
                for line in ax.lines[:len(ARMS)]] for ax in axes]
    assert all(c == colours[0] for c in colours) and len(set(colours[0])) == len(ARMS)
    assert any(set(line.get_ydata()) == {TAU} for line in axes[0].lines)
    # the lambda panel shows each arm's lambda averaged over the trailing window: a fixed arm is flat at its lambda
    window = int(report["window"].iloc[0])
    shown = [np.asarray(line.get_ydata(), dtype=float) for line in axes[2].lines]
    for arm in ARMS:
        want = traces["control"].loc[traces["control"]["arm"] == arm, "lambda"].rolling(window, min_periods=1).mean()
        assert any(len(y) == len(want) and np.allclose(y, want.to_numpy()) for y in shown), arm
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels == ["fixed $\\lambda^*$", "fixed LTT $\\lambda$", "online $\\eta$ = 0.05",
                      "oracle (best fixed $\\lambda$ in hindsight)", f"$\\tau$ = {TAU:g}"]


def test_a_trace_of_a_scenario_not_in_the_report_is_refused(tmp_path, capsys):
    root = tmp_path / "results" / "x"
    report = _report(root)
    traces = _traces(root, (*SCENARIOS, "drift"))
    rc = _figure(tmp_path, report, traces)
    err = capsys.readouterr().err
    assert rc == 2 and f"{traces[-1]}: scenario 'drift' is not in {report}" in err
    assert not list(tmp_path.glob("f.*"))


def test_a_report_with_two_taus_is_refused(tmp_path, capsys):
    root = tmp_path / "results" / "x"
    report = _report(root)
    df = pd.read_csv(report)
    df.loc[0, "tau"] = 0.6
    df.to_csv(report, index=False)
    assert _figure(tmp_path, report, _traces(root)) == 2
    assert f"{report}: several taus (0.5, 0.6)" in capsys.readouterr().err


def _run_files(root):
    """A finished run's own files for `lara summary`: lambda.json, eval/constraint_audit.json, eval/summary.csv."""
    (root / "calibration").mkdir(parents=True, exist_ok=True)
    (root / "eval").mkdir(exist_ok=True)
    (root / "calibration" / "lambda.json").write_text(json.dumps({
        "lambda_hat": 0.3, "lambda_star": LAMBDA_STAR, "tau": TAU, "mode": "bon", "feasible": True,
        "status": "interior", "decoder": {"kind": "best_of_n", "n": 4, "k": 8},
        "bootstrap": {"quantile": 0.95, "replicates": 200, "quantiles": {"0.95": LAMBDA_STAR}}}))
    (root / "eval" / "constraint_audit.json").write_text(json.dumps({"question": "Best-of-N at lambda*"}))
    band = {f"{m}{s}": v for m, v in (("helpfulness", 1.0), ("harmfulness", 0.2)) for s in ("", "_lo", "_hi")}
    pd.DataFrame([{"method": "bon", "setting": "star", **band}]).to_csv(root / "eval" / "summary.csv", index=False)


def test_summary_reads_the_verdicts_and_numbers_off_the_report(tmp_path):
    from lara.evaluate.deployment_report import deployment_lines
    from lara.evaluate.summary import summarise_run

    root = tmp_path / "results" / "x"
    _run_files(root)
    before = summarise_run(root)
    assert "After deployment" not in before and deployment_lines(root) == []  # no report: no section
    report = _report(root)
    _traces(root)
    _shift(root, "harmful_heavy")
    text = summarise_run(root)
    offline = before.split("\ncalibration (", 1)[1].split("\nfigures: ")[0]
    assert text.split("\ncalibration (", 1)[1].startswith(offline)  # the offline part unchanged
    assert "after deployment" not in before  # ... and the headline says what broke only once there is a report
    assert ("after deployment (2 scenarios): fixed lambda* broke tau in harmful_heavy (0.637); held tau in every "
            "scenario: " in text.split("\ncalibration (", 1)[0])
    section = text.split("After deployment")[1]
    assert f"({report})" in text.split("After deployment")[1].splitlines()[0]
    heavy = section.split("  harmful_heavy:")[1]
    control = section.split("  control:")[1].split("  harmful_heavy:")[0]
    assert ("reading on harmful_heavy: fixed lambda* violates tau (mean cost 0.637 > tau 0.5); fixed LTT lambda "
            "violates tau (mean cost 0.521 > tau 0.5); online eta=0.05 holds tau (mean cost 0.493 <= tau 0.5; "
            "every 50-visit window <= certificate 0.845, worst 0.612); oracle holds tau (mean cost 0.497 <= tau 0.5)"
            ) in heavy
    assert "reading on control: fixed lambda* holds tau (mean cost 0.412 <= tau 0.5)" in control
    # the shift check: from shift.json where there is one (with its statement), else the report's columns
    assert "shift check: AUC 0.830, p 0.001, ESS 41.5 of 300 calibration prompts (needs 50): shifted" in heavy
    assert "reweighted lambda not certified" in heavy and "the offline guarantee does not carry over" in heavy
    assert "shift check: AUC 0.510, p 0.62, ESS 180.2: not shifted" in control
    # the table: every number from the report
    row = next(line for line in heavy.splitlines() if line.strip().startswith("online eta=0.05"))
    assert row.split()[2:] == ["0.4", "->", "0.95", "0.493", "0.612", "0.845", "0.031", "met", "violated"]
    row = next(line for line in heavy.splitlines() if line.strip().startswith("fixed lambda*"))
    assert row.split()[2:] == ["0.4", "->", "0.4", "0.637", "0.702", "-", "-0.052", "violated", "violated"]
    assert "T = 200 visits in batches of 10, windows of 50 visits" in control


def test_summary_refuses_a_report_for_another_calibration(tmp_path, capsys):
    from lara.evaluate.summary import summarise_run
    from lara.read.files import DataError

    root = tmp_path / "results" / "x"
    _run_files(root)
    report = _report(root)
    lam = str(root / "calibration" / "lambda.json")
    assert _figure(tmp_path, report, _traces(root), "--lambda-json", lam) in (0, None)  # its own calibration
    df = pd.read_csv(report)
    df.loc[df["arm"] == "fixed_star", ["lambda_start", "lambda_end"]] = 0.8
    df.to_csv(report, index=False)
    with pytest.raises(DataError, match="its fixed_star lambda is 0.8, .*lambda.json's lambda\\* 0.4"):
        summarise_run(root)
    capsys.readouterr()
    assert _figure(tmp_path, report, _traces(root), "--lambda-json", lam) == 2
    assert f"{report}: does not belong to {lam}" in capsys.readouterr().err


def test_summary_refuses_a_met_column_that_contradicts_the_mean_cost(tmp_path):
    from lara.evaluate.summary import summarise_run
    from lara.read.files import DataError

    root = tmp_path / "results" / "x"
    _run_files(root)
    report = _report(root)
    df = pd.read_csv(report)
    df.loc[(df["scenario"] == "harmful_heavy") & (df["arm"] == "fixed_star"), "met"] = True
    df.to_csv(report, index=False)
    with pytest.raises(DataError, match="harmful_heavy/fixed_star: met is True but mean cost 0.637"):
        summarise_run(root)


@pytest.mark.parametrize("column, row, value, message", [
    ("window_met", ("harmful_heavy", "fixed_star"), True, "window_met is True but the worst window's cost 0.702"),
    ("window_met", ("control", "fixed_star"), "no", "column 'window_met' holds 'no' at row"),
    ("met", ("harmful_heavy", "fixed_star"), "yes", "column 'met' holds 'yes' at row"),
    ("met", ("harmful_heavy", "fixed_star"), "False ", "column 'met' holds 'False ' at row"),
    ("mean_cost", ("harmful_heavy", "fixed_star"), "nan", "mean_cost"),
])
def test_a_report_cell_the_report_contradicts_or_that_is_no_value_is_refused(tmp_path, column, row, value, message):
    """Every verdict of the report is held to its own numbers, and the headline reads the report through the same
    checks: a window verdict its worst window contradicts, a word that is not True/False, a missing mean."""
    from lara.evaluate.summary import summarise_run
    from lara.read.files import DataError

    root = tmp_path / "results" / "x"
    _run_files(root)
    report = _report(root)
    df = pd.read_csv(report, dtype={column: object})
    df.loc[(df["scenario"] == row[0]) & (df["arm"] == row[1]), column] = value
    df.to_csv(report, index=False)
    with pytest.raises(DataError, match=re.escape(message)):
        summarise_run(root)


def test_an_oracle_that_holds_no_tau_is_drawn_and_said(tmp_path):
    """No fixed lambda meets tau on a stream (lara deploy-arms: the oracle's lambda is infinite, feasible False, no
    reward given up), in a report without the optional columns (weighted_certified, batch_size)."""
    from lara.evaluate.summary import summarise_run

    root = tmp_path / "results" / "x"
    _run_files(root)
    report, traces = _report(root), _traces(root)
    df = pd.read_csv(report).drop(columns=["weighted_certified", "batch_size"])
    oracle = (df["scenario"] == "harmful_heavy") & (df["arm"] == "oracle")
    df["feasible"] = ~oracle
    df.loc[oracle, ["lambda_start", "lambda_end", "mean_cost", "met", "reward_given_up"]] = [np.inf, np.inf, 0.55,
                                                                                          False, np.nan]
    df.loc[df["scenario"] == "harmful_heavy", "reward_given_up"] = np.nan
    df.to_csv(report, index=False)
    trace = pd.read_parquet(traces[1])
    trace.loc[trace["arm"] == "oracle", "lambda"] = np.inf
    trace.to_parquet(traces[1])
    assert _figure(tmp_path, report, traces) in (0, None) and (tmp_path / "f.png").stat().st_size > 0
    text = summarise_run(root)
    assert ("reading on harmful_heavy: fixed lambda* violates tau (mean cost 0.637 > tau 0.5); fixed LTT lambda "
            "violates tau (mean cost 0.521 > tau 0.5); no fixed lambda holds tau on this stream (the safest "
            "candidates average 0.550 > tau 0.5); online eta=0.05 holds tau") in text
    row = next(line for line in text.split("  harmful_heavy:")[1].splitlines() if line.strip().startswith("oracle"))
    assert row.split()[1:] == ["inf", "->", "inf", "0.550", "0.580", "-", "-", "violated", "violated"]
    assert "  harmful_heavy: T = 200 visits, windows of 50 visits" in text


def test_an_online_arm_over_tau_within_its_certificate_on_the_mean_is_said_so():
    from lara.evaluate.deployment_report import verdict_clause

    row = {"arm": "online_eta_0p01", "step_size": 0.01, "mean_cost": -0.49, "tau": -0.5, "met": False,
           "mean_certificate": -0.48, "certificate": -0.3, "worst_window_cost": -0.35, "window": 500}
    said = verdict_clause(row)
    assert "exceeds tau by 0.0100" in said and "within its certificate on the mean -0.4800" in said
    assert "violates" in verdict_clause(row | {"mean_certificate": -0.495})  # beyond the certificate: a violation
    assert "violates" in verdict_clause(row | {"mean_certificate": None})  # a fixed arm has none
