"""λ after deployment, read back: the deployment report (``results/{exp}/deployment/report.csv``), the arms'
traces (``deployment/{scenario}/trace.parquet``) and the shift checks (``deployment/{scenario}/shift.json``),
for ``lara figure --kind deployment`` and the "After deployment" section of ``lara summary``.

One reader per file, checking the columns both consumers need, so a report the summary prints is a report the
figure could draw. The arms (what each is: :mod:`lara.deploy.arms`) are named once here (:func:`arm_label`), so the
figure's legend and the summary's table say the same thing.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from lara.data.errors import DataError

REPORT_COLUMNS = ("scenario", "arm", "T", "window", "tau", "lambda_start", "lambda_end", "mean_cost", "mean_reward",
                  "worst_window_cost", "met")
# read when there (empty where they do not apply): the online arms' step size and certificate, the oracle's
# comparison, and the scenario's shift check, repeated on each of its rows (shift.json has it too)
OPTIONAL_REPORT_COLUMNS = ("step_size", "batch_size", "lambda_min", "lambda_max", "certificate", "reward_given_up",
                           "window_met", "feasible", "auc", "p_value", "ess", "shifted", "weights_usable",
                           "weighted_certified")
FINITE_REPORT_COLUMNS = ("tau", "mean_cost", "mean_reward")  # lambda is infinite for an oracle that holds no tau
TRACE_COLUMNS = ("t", "arm", "lambda", "cost", "reward", "mean_cost")
ONLINE_PREFIX = "online_eta_"
NAMES = {"fixed_star": ("fixed lambda*", "fixed $\\lambda^*$"),
         "fixed_ltt": ("fixed LTT lambda", "fixed LTT $\\lambda$"),
         "fixed_weighted": ("fixed reweighted lambda", "fixed reweighted $\\lambda$"),
         "fixed_ltt_wsr": ("fixed LTT-WSR lambda", "fixed LTT-WSR $\\lambda$"),
         "oracle": ("oracle", "oracle (best fixed $\\lambda$ in hindsight)")}


def flag(value) -> bool | None:
    """A boolean column of a CSV: True, False (as the report writes them, or the literals true/false) or None
    (empty); any other text, a number or a padded word is refused (``bool("no")`` is True)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, str) and value in ("True", "False", "true", "false", ""):
        return {"": None}.get(value, value.lower() == "true")
    raise ValueError(repr(value))


def number(value) -> float | None:
    """A numeric cell, None when empty."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(x) else x


def step_size(arm: str, value=None) -> float | None:
    """An online arm's step size η: the report's ``step_size`` if given, else read off the name (0p05 is 0.05)."""
    given = number(value)
    if given is not None or not arm.startswith(ONLINE_PREFIX):
        return given
    try:
        return float(arm.removeprefix(ONLINE_PREFIX).replace("p", "."))
    except ValueError:
        return None


def arm_label(arm: str, eta=None, tex: bool = False) -> str:
    """The arm's name in words (``tex``: with matplotlib's mathtext, for a figure)."""
    if arm.startswith(ONLINE_PREFIX):
        eta = step_size(arm, eta)
        shown = f"{eta:g}" if eta is not None else arm.removeprefix(ONLINE_PREFIX)
        return f"online $\\eta$ = {shown}" if tex else f"online eta={shown}"
    plain, mathtext = NAMES.get(arm, (arm, arm))
    return mathtext if tex else plain


def read_report(path: str | Path, lambda_record=None) -> pd.DataFrame:
    """report.csv: every column of :data:`REPORT_COLUMNS`, one row per (scenario, arm), one tau, finite means,
    ``met`` as the report's own mean cost against tau says; made for ``lambda_record`` (its tau and, on the
    ``fixed_star`` arm, its lambda*) when one is given."""
    from lara.read.files import read_table, require_finite, require_rows

    report = require_rows(read_table(path, required=REPORT_COLUMNS), path)
    require_finite(report, FINITE_REPORT_COLUMNS, path)
    report = report.astype({"scenario": str, "arm": str})
    report = report.assign(**{c: None for c in OPTIONAL_REPORT_COLUMNS if c not in report.columns})
    vector = "constraint" in report.columns  # deployment.follows: constraints: one row per arm and constraint
    twice = report.duplicated(["scenario", "arm", *(["constraint"] if vector else [])])
    if twice.any():
        r = report[twice].iloc[0]
        raise DataError(f"{path}: scenario {r['scenario']!r} lists arm {r['arm']!r} twice (one row per scenario and arm"
                        f"{' and constraint' if vector else ''})")
    taus = sorted(set(report["tau"].astype(float)))
    if vector and report.groupby("constraint")["tau"].nunique().max() > 1:
        raise DataError(f"{path}: a constraint with several taus; a deployment report holds one tau per constraint")
    if len(taus) > 1 and not vector:
        raise DataError(f"{path}: several taus ({', '.join(f'{t:g}' for t in taus)}); a deployment report holds one "
                        "tau (the calibrated one)")
    for col in ("met", "window_met", "feasible", "shifted", "weights_usable", "weighted_certified"):
        values = []
        for row, v in enumerate(report[col]):
            try:
                values.append(flag(v))
            except ValueError as exc:
                raise DataError(f"{path}: column {col!r} holds {exc} at row {row}, not True, False or empty") from None
        report[col] = values
    # each verdict as its own cost against tau says (window_met: where both are given; met: always)
    worst = [number(v) for v in report["worst_window_cost"]]
    for col, what, costs in (("window_met", "the worst window's cost", worst), ("met", "mean cost",
                                                                                list(report["mean_cost"]))):
        off = [i for i, (m, c, t) in enumerate(zip(report[col], costs, report["tau"], strict=True))
               if (col == "met" or m is not None and c is not None) and m is not bool(c <= t)]
        if off:
            r, c = report.iloc[off[0]], costs[off[0]]
            raise DataError(f"{path}: {r['scenario']}/{r['arm']}: {col} is {r[col]} but {what} {c:g} against tau "
                            f"{r['tau']:g} says {c <= r['tau']}")
    if lambda_record is None or vector:  # the vector report follows constraints/lambda.json, not this one
        return report
    # the report was made for this calibration: its tau, and λ* as the fixed_star arm's λ
    record, tau = lambda_record, float(report["tau"].iloc[0])
    problems = [] if math.isclose(tau, record.tau, rel_tol=1e-9, abs_tol=1e-12) else \
        [f"its tau is {tau:g}, {record.path}'s {record.tau:g}"]
    star = report.loc[report["arm"] == "fixed_star", "lambda_start"].astype(float)
    off = star[[not math.isclose(v, record.lambda_star, rel_tol=1e-6, abs_tol=1e-12) for v in star]]
    if len(off):
        problems.append(f"its fixed_star lambda is {off.iloc[0]:g}, {record.path}'s lambda* {record.lambda_star:g}")
    if problems:
        raise DataError(f"{path}: does not belong to {record.path}: {'; '.join(problems)}. Rerun the workflow (the "
                        "deployment steps follow the calibration)")
    return report


def read_traces(paths: list[str], report: pd.DataFrame, report_path) -> dict[str, pd.DataFrame]:
    """The traces by scenario, in the report's scenario order: one of each scenario of the report, with arms
    the report lists for that scenario and finite lambda and running mean cost."""
    from lara.identity import read_identity
    from lara.read.files import read_table, require_finite, require_rows

    tau = float(report["tau"].iloc[0])
    found: dict[str, tuple[str, pd.DataFrame]] = {}
    for path in paths:
        made = read_identity(path)
        scenario = str(made.get("scenario") or Path(path).parent.name)  # else its folder's name
        if scenario not in set(report["scenario"]):
            raise DataError(f"{path}: scenario {scenario!r} is not in {report_path} (scenarios: "
                            f"{', '.join(dict.fromkeys(report['scenario']))}); the trace is from another deployment "
                            "run")
        if scenario in found:
            raise DataError(f"{path}: a second trace for scenario {scenario!r} (the first: {found[scenario][0]})")
        rows = report[report["scenario"] == scenario]
        for col, flag in (("lambda_record", "--lambda-json"), ("stream", "--candidates")):
            ran = (made.get("made_from") or {}).get(flag)
            if col in rows.columns and ran is not None and str(rows[col].iloc[0]) != ran:
                raise DataError(f"{path}: made with another {col.replace('_', ' ')} ({ran}) than {report_path}'s "
                                f"{scenario} arms ({rows[col].iloc[0]}); the trace is from another deployment run")
        made_for = number(made.get("tau"))
        if made_for is not None and not math.isclose(made_for, tau, rel_tol=1e-9, abs_tol=1e-12):
            raise DataError(f"{path}: made for tau {made_for:g}, {report_path} for tau {tau:g}")
        trace = require_finite(require_rows(read_table(path, required=TRACE_COLUMNS), path), ("t", "mean_cost"), path)
        if trace["lambda"].isna().any():
            raise DataError(f"{path}: column 'lambda' has no value at some visit (infinite only for an oracle that "
                            "holds no tau)")
        trace = trace.astype({"arm": str})
        extra = sorted(set(trace["arm"]) - set(report.loc[report["scenario"] == scenario, "arm"]))
        if extra:
            raise DataError(f"{path}: arm(s) {', '.join(extra)} of scenario {scenario!r} are not in {report_path}")
        found[scenario] = (str(path), trace.sort_values(["arm", "t"]))
    order = list(dict.fromkeys(report["scenario"]))
    missing = [s for s in order if s not in found]
    if missing:  # the figure would leave the scenario out while its caption lists it
        raise DataError(f"--traces: no trace for scenario(s) {', '.join(missing)} of {report_path} (one "
                        "{scenario}/trace.parquet per scenario of the report)")
    return {s: found[s][1] for s in order}


def shows(report: pd.DataFrame) -> dict:
    """What the deployment figure shows, for its provenance sidecar and report caption."""
    arms = list(dict.fromkeys(report["arm"]))
    etas = sorted({step_size(a, e) for a, e in zip(report["arm"], report["step_size"], strict=True)
                   if a.startswith(ONLINE_PREFIX)} - {None})
    held = {s: [arm_label(a) for a, m in zip(g["arm"], g["met"], strict=True) if m]
            for s, g in report.groupby("scenario", sort=False)}
    return {"tau": float(report["tau"].iloc[0]), "scenarios": list(held), "arms": [arm_label(a) for a in arms],
            "step_sizes": etas, "T": sorted({int(t) for t in report["T"]}),
            "window": sorted({int(w) for w in report["window"]}), "held": held}


# ---------------------------------------------------------------------------------------------------------------
# lara summary: "After deployment"

DEPLOYMENT_READING = """\
  arms          fixed lambda* (bootstrap), fixed LTT lambda (certified), fixed reweighted lambda (covariate-shift
                weights, where certified), online eta=E (lambda follows the cost from lambda*, step size E),
                oracle (the best fixed lambda in hindsight for the stream);
  mean cost     over a stream's T visits by the decoding cost model (tau's units); mean: met when <= tau;
  worst window  the largest mean cost over W consecutive visits (windows: met when <= tau); certificate: an
                online arm's bound on every window's mean (tau + (lambda_max - lambda_min + upper clips) / (eta W));
  given up      the oracle's mean reward minus the arm's;
  shift check   a classifier tells calibration from deployment prompts (AUC, permutation p-value), ESS is the
                effective sample size of the reweighted calibration set: the offline guarantee carries over only
                when the prompts are not shifted."""


def read_shift(path: Path, rows: pd.DataFrame, report_path) -> dict:
    """shift.json beside a scenario's trace, agreeing with the shift columns of the report's rows; without the file,
    the report's own columns (and no statement)."""
    first = rows.iloc[0]
    from_report = {"auc": number(first["auc"]), "p_value": number(first["p_value"]), "ess": number(first.get("ess")),
                   "shifted": first["shifted"], "weights_usable": first.get("weights_usable"),
                   "weighted_certified": first.get("weighted_certified")}  # (the vector report has no weighted arm)
    if not path.exists():
        return from_report | {"statement": None, "path": None}
    try:
        from lara.read.files import json_file
        shift = json_file(path, mapping=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable shift check ({exc})") from None
    # a shift check a step wrote (it states what it is) is of this scenario's own stream (what deployment-report holds
    # a --shift to), whether or not the report carries shift columns to compare
    made = shift.get("identity") if isinstance(shift.get("identity"), dict) else {}
    for key in ("scenario", "stream"):
        if made and key in rows.columns and str(made.get(key)) != str(first[key]):
            raise DataError(f"{path}: the shift check of {key} {made.get(key)!r}, but {report_path} gives "
                            f"{first[key]!r} for scenario {first['scenario']!r}; a check of another stream")
    for key in ("auc", "p_value", "ess"):
        a, b = number(shift.get(key)), from_report[key]
        if a is not None and b is not None and not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9):
            raise DataError(f"{path}: {key} {a:g}, but {report_path} says {b:g} for scenario {first['scenario']!r}; "
                            "the files are from different deployment runs")
    return from_report | {k: v for k, v in shift.items() if v is not None} | {"path": path}


def _fmt(value, spec: str = ".3f", empty: str = "-") -> str:
    x = number(value)
    return empty if x is None else format(x, spec)


def shift_line(shift: dict) -> str:
    shifted = flag(shift.get("shifted"))
    verdict = {True: "shifted", False: "not shifted", None: "shift unknown"}[shifted]
    ess = _fmt(shift.get("ess"), ".1f")
    if shift.get("n_calibration") is not None:
        ess += f" of {shift['n_calibration']} calibration prompts"
    if shift.get("min_ess") is not None:
        ess += f" (needs {_fmt(shift['min_ess'], 'g')})"
    line = f"    shift check: AUC {_fmt(shift.get('auc'))}, p {_fmt(shift.get('p_value'), '.3g')}, ESS {ess}: {verdict}"
    weighted, usable = flag(shift.get("weighted_certified")), flag(shift.get("weights_usable"))
    if weighted is not None:
        line += f"; reweighted lambda {'certified' if weighted else 'not certified'}"
    elif usable is not None:
        line += f"; weights {'usable' if usable else 'not usable'}"
    if shift.get("path"):
        line += f" ({shift['path']})"
    return line + (f"\n      {shift['statement']}" if shift.get("statement") else "")


def arm_table(rows: pd.DataFrame, scenario: str, vector: bool = False) -> list[str]:
    """The arms of a scenario: lambda, costs, certificate, reward given up, and each against tau; then the reading:
    which arms held tau, the violations first. For the vector lambda one line per arm and constraint: its tau,
    costs, certificate, reward and verdict (no reading)."""
    head, tail = ((f"{'constraint':12} {'tau':>8}", f"{'reward':>8}  verdict") if vector else
                  (f"{'lambda start -> end':>21}", f"{'given up':>8}  {'mean':8}  windows"))
    lines = [f"    {'arm':18} {head}  {'mean cost':>9}  {'worst window':>12}  {'certificate':>11}  {tail}"]
    for r in rows.to_dict("records"):
        met = "met" if r["met"] else "violated"
        if vector:
            head = f"{r['constraint']:12} {r['tau']:8.3g}"
            tail = f"{r['mean_reward']:8.3f}  {met}" + ("" if r["window_met"] is not False else ", a window above")
        else:
            head = format(f"{r['lambda_start']:.4g} -> {r['lambda_end']:.4g}", ">21")
            tail = f"{_fmt(r['reward_given_up']):>8}  {met:8}  " + {True: "met", False: "violated", None: "-"}[
                r["window_met"]]
        lines.append(f"    {arm_label(r['arm'], r['step_size']):18} {head}  {r['mean_cost']:9.3f}  "
                     f"{_fmt(r['worst_window_cost']):>12}  {_fmt(r['certificate']):>11}  {tail}")
    if vector:
        return lines
    records = sorted(rows.to_dict("records"), key=lambda r: bool(r["met"]))
    return lines + [f"    reading on {scenario}: " + "; ".join(verdict_clause(r) for r in records)]


def verdict_clause(r: dict) -> str:
    """One arm against tau, in words, with the numbers it rests on."""
    name, cost, tau = arm_label(r["arm"], r["step_size"]), r["mean_cost"], r["tau"]
    if r["arm"] == "oracle" and r["feasible"] is False:
        return f"no fixed lambda holds tau on this stream (the safest candidates average {cost:.3f} > tau {tau:g})"
    bound = number(r.get("mean_certificate"))
    if not r["met"] and bound is not None and cost <= bound + 1e-12:
        return (f"{name} exceeds tau by {cost - tau:.4f} (mean cost {cost:.4f}), within its certificate on the mean "
                f"{bound:.4f} = tau + (lambda_end - lambda_start) / (eta T): lambda had to move from lambda* to "
                "where this traffic needs it, and the excess shrinks as 1 / T")
    if not r["met"]:
        return f"{name} violates tau (mean cost {cost:.3f} > tau {tau:g})"
    clause = f"{name} holds tau (mean cost {cost:.3f} <= tau {tau:g}"
    cert, worst = number(r["certificate"]), number(r["worst_window_cost"])
    if cert is not None:
        clause += f"; every {int(r['window'])}-visit window <= certificate {cert:.3f}"
        if worst is not None:
            clause += f", worst {worst:.3f}" + ("" if worst <= cert else " ABOVE its certificate")
    return clause + ")"


def deployment_lines(root: Path, lambda_record=None) -> list[str]:
    """The "After deployment" section of ``lara summary``: nothing when the run has no deployment report."""
    path = root / "deployment" / "report.csv"
    return report_lines(read_report(path, lambda_record), path, root) if path.exists() else []


def report_lines(report: pd.DataFrame, path, root: Path | None = None) -> list[str]:
    """The section's lines: per scenario its shift check (beside its trace under ``root``, if given) and its arms;
    for the vector lambda (deployment.follows: constraints) per arm each constraint's mean and worst-window cost
    against its tau, and the online arms' certificates."""
    vector = "constraint" in report.columns
    lines = ["", f"After deployment ({path}): " + (
        "the vector lambda of the constraints on streams of visits (one row per arm and constraint; no reweighted "
        "arm: the covariate-shift weights are scalar only)" if vector else "lambda on streams of visits (Best-of-N "
        f"on each visit's candidates), tau = {report['tau'].iloc[0]:g}")]
    for scenario, rows in report.groupby("scenario", sort=False):
        r = rows.iloc[0]
        batches = "" if vector or number(r["batch_size"]) is None else f" in batches of {int(number(r['batch_size']))}"
        shift = [] if root is None else [shift_line(read_shift(root / "deployment" / scenario / "shift.json", rows,
                                                               path))]
        lines += ["", f"  {scenario}: T = {int(r['T'])} visits{batches}, windows of {int(r['window'])}"
                      f"{'' if vector else ' visits'}", *shift,
                  *arm_table(rows, scenario, vector)]
    return lines + ["", DEPLOYMENT_READING]
