"""``lara deployment-report``: every scenario's arms in one table, with its shift check beside them.

One row per (scenario, arm): the arm's long-run and worst-window mean cost against tau (``met``, ``window_met``:
the audit rows of deployment), its certificate, the reward it gives up against the oracle, and the scenario's
shift check (AUC, permutation p, effective sample size, whether the weighted lambda could be certified).
``lara summary`` and the deployment figure read it. With the vector lambda (deployment.follows: constraints) one
row per (scenario, arm, constraint), each against its own tau_j (``met_all``: the arm held every tau).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from lara.data.errors import DataError

log = logging.getLogger(__name__)

HELP = "every deployment scenario's arms and shift check in one table (report.csv)"
OUTPUTS = ("out",)
SHIFT_COLUMNS = ("auc", "p_value", "ess", "shifted", "weights_usable")


def read_shift(path) -> dict:
    from lara import identity

    try:
        from lara.read.files import json_file
        data = json_file(Path(path), mapping=False)
    except (OSError, ValueError) as exc:
        raise DataError(f"--shift {path}: not a readable shift check ({exc})") from None
    if not isinstance(data, dict) or (identity.read_identity(path).get("kind") not in (None, "shift_check")):
        raise DataError(f"--shift {path}: not the output of `lara shift-check`")
    missing = [k for k in ("scenario", *SHIFT_COLUMNS) if k not in data]
    if missing:
        raise DataError(f"--shift {path}: missing key(s) {', '.join(missing)}")
    return data


def check_arms(arms: list[pd.DataFrame], paths: list[str]) -> None:
    """Each arms table is one scenario's (a named scenario, one stream), every verdict is its numbers' (met: mean
    cost <= tau; window_met: worst window <= tau: a verdict edited by hand is refused), and all of them were made
    with one lambda record on distinct streams."""
    records, streams = {}, {}
    for df, path in zip(arms, paths, strict=True):
        names = df["scenario"].dropna().astype(str).str.strip()
        if len(names) != len(df) or (names == "").any() or names.nunique() != 1:
            raise DataError(f"--arms {path}: column 'scenario' must name one scenario in every row")
        for verdict, value in (("met", "mean_cost"), ("window_met", "worst_window_cost")):
            if verdict not in df.columns or value not in df.columns:
                continue
            want = df[value].astype(float) <= df["tau"].astype(float)
            got = df[verdict].map(lambda v: v if isinstance(v, (bool, np.bool_)) else str(v).lower() == "true")
            bad = np.flatnonzero(got.to_numpy(bool) != want.to_numpy(bool))
            if len(bad):
                r = df.iloc[bad[0]]
                raise DataError(f"--arms {path}: arm {r['arm']}: {verdict} {r[verdict]} but {value} "
                                f"{float(r[value]):.6g} vs tau {float(r['tau']):g}: a verdict is its numbers' (edited "
                                "by hand?)")
        for col in ("lambda_record", "stream"):
            other = np.flatnonzero(df[col].astype(str).to_numpy() != str(df[col].iloc[0]))
            if len(other):
                r = df.iloc[other[0]]
                raise DataError(f"--arms {path}: row {other[0]} (arm {r['arm']}) has {col} {r[col]}, the first row "
                                f"{df[col].iloc[0]}: one scenario's arms ran on one stream with one lambda record")
        keys = ["arm", "constraint"] if "constraint" in df.columns else ["arm"]
        twice = df.duplicated(keys)
        if twice.any():
            r = df[twice].iloc[0]
            raise DataError(f"--arms {path}: arm {r['arm']} is given twice in scenario {names.iloc[0]!r}")
        records.setdefault(str(df["lambda_record"].iloc[0]), path)
        stream = str(df["stream"].iloc[0])
        if stream in streams:
            raise DataError(f"--arms {path}: the same stream as {streams[stream]} under scenario "
                            f"{names.iloc[0]!r}: one scenario's arms given twice?")
        streams[stream] = path
    if len(records) > 1:
        (a, pa), (b, pb) = list(records.items())[:2]
        raise DataError(f"--arms {pb}: made with another lambda record ({b}) than {pa} ({a}); one report compares "
                        "the arms of one calibration")
    # the weighted lambda's verdict (weighted_certified): stated by every scalar table of one deployment run, or none
    weighted = [bool(df["weighted_certified"].notna().any()) if "weighted_certified" in df.columns else None
                for df in arms]
    if {True, False} <= set(weighted):
        raise DataError(f"--arms {paths[weighted.index(False)]}: made without --weighted (no weighted_certified), "
                        f"{paths[weighted.index(True)]} with it: one report compares the arms of one deployment run")


def combine(arms: list[pd.DataFrame], shifts: list[dict], where: list[str]) -> pd.DataFrame:
    scenarios = [str(a["scenario"].iloc[0]) for a in arms]
    if len(set(scenarios)) != len(scenarios):
        twice = next(s for s in scenarios if scenarios.count(s) > 1)
        raise DataError(f"--arms: scenario {twice!r} is given twice")
    vector = ["constraint" in a.columns for a in arms]
    if len(set(vector)) > 1:
        raise DataError("--arms: some tables have one row per arm and constraint (lara deploy-arms --constraints), "
                        "others one per arm: one report follows one lambda (deployment.follows)")
    budgets = pd.concat([a[["constraint", "tau"]] if vector[0] else a[["tau"]].assign(constraint=None)
                         for a in arms]).astype({"tau": float}).drop_duplicates()
    if budgets["constraint"].astype(str).duplicated().any():  # a constraint (or the one cost) under two taus
        raise DataError(f"--arms: the scenarios were audited against different budgets (tau "
                        f"{sorted(set(budgets['tau']))})")
    by_scenario = {}
    for data, path in zip(shifts, where, strict=True):
        if data["scenario"] not in scenarios:
            raise DataError(f"--shift {path}: scenario {data['scenario']!r} has no arms (--arms: {scenarios})")
        if data["scenario"] in by_scenario:
            raise DataError(f"--shift {path}: a second shift check of scenario {data['scenario']!r}")
        checked = (data.get("identity") or {}).get("stream")
        ran = str(arms[scenarios.index(data["scenario"])]["stream"].iloc[0])
        if checked is not None and str(checked) != ran:
            raise DataError(f"--shift {path}: the shift check of scenario {data['scenario']!r} is of stream {checked}, "
                            f"but the arms of that scenario ran on stream {ran}: another scenario's check?")
        by_scenario[data["scenario"]] = data
    unchecked = [name for name in scenarios if name not in by_scenario]
    if by_scenario and unchecked:  # one deployment run checks every scenario's shift, or none
        raise DataError(f"--shift: no shift check of scenario {unchecked[0]!r} of --arms, while those of "
                        f"{sorted(by_scenario)} are given: one report gives every scenario's shift.json, or none")
    table = pd.concat(arms, ignore_index=True)
    for col in SHIFT_COLUMNS:
        table[col] = table["scenario"].map(lambda s, c=col: by_scenario.get(s, {}).get(c))
    table["offline_guarantee"] = table["scenario"].map(lambda s: carries_over(by_scenario.get(s)))
    return table


def carries_over(shift: dict | None) -> str:
    """Whether the calibration's offline guarantee carries over to a scenario's deployment prompts, as far as the
    shift check can tell (a check that finds nothing does not prove there is no shift, and sees only the stream's
    first prompts: a later drift is the online lambda's to follow)."""
    if shift is None:
        return "unknown (no shift check)"
    if shift["shifted"]:
        return (f"does not carry over: the deployment prompts differ from the calibration prompts (AUC "
                f"{shift['auc']:.3f}, p = {shift['p_value']:.3g})")
    return f"no detectable shift in the first deployment prompts (AUC {shift['auc']:.3f}, p = {shift['p_value']:.3g})"


def add_arguments(parser) -> None:
    parser.add_argument("--arms", nargs="+", required=True, help="each scenario's arms.csv (lara deploy-arms)")
    parser.add_argument("--shift", nargs="*", default=[], help="the scenarios' shift.json (lara shift-check)")
    parser.add_argument("--out", required=True, help="output CSV")


def run(args) -> None:
    from lara import identity
    from lara.read.files import read_table, write_table

    identity.distinct_files(args.arms, "--arms")
    arms = [read_table(p, required=("scenario", "arm", "tau", "mean_cost", "met", "lambda_record", "stream"))
            for p in args.arms]
    check_arms(arms, args.arms)
    table = combine(arms, [read_shift(p) for p in args.shift], args.shift)
    write_table(table, args.out)
    for row in table.itertuples(index=False):
        log.info("%-16s %-18s mean cost %8.4f  %s", row.scenario, row.arm, row.mean_cost,
                 "met" if row.met else "VIOLATED")
