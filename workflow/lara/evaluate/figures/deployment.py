"""``lara figure --kind deployment``: lambda after deployment, one column per scenario: each arm's running mean
cost against the visit t with tau (top) and its lambda_t (bottom)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lara.evaluate.figures.common import Drawn, FigureSettings, theme


def deployment(report: pd.DataFrame, traces: dict[str, pd.DataFrame], opts: FigureSettings):
    """Lambda after deployment (lara.evaluate.deployment_report): one column per scenario; top, each arm's running
    mean cost against the visit t with tau dashed (the y range read off the visits after the first window, where
    a running mean of a few visits swings widely); bottom, its lambda_t averaged over the trailing W visits (an
    online lambda moves every visit; flat for the fixed arms and the oracle). One colour per arm in every panel."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from lara.evaluate.deployment_report import arm_label

    pal = theme(opts)
    arms = list(dict.fromkeys(report["arm"]))
    colour = {a: "black" if a == "oracle" else pal[i % len(pal)] for i, a in enumerate(arms)}
    style = {a: ":" if a == "oracle" else "--" if a.startswith("fixed") else "-" for a in arms}
    eta = dict(zip(report["arm"], report["step_size"], strict=True))
    tau = float(report["tau"].iloc[0])
    fig, axes = plt.subplots(2, len(traces), figsize=(max(opts.width, 3.2 * len(traces)), 2 * opts.height + 0.8),
                             sharex="col", sharey="row", squeeze=False, layout="constrained")
    window = int(report["window"].iloc[0])
    settled = [tau]
    for j, (scenario, trace) in enumerate(traces.items()):
        top, bottom = axes[0, j], axes[1, j]
        for arm, g in trace.groupby("arm", sort=False):
            top.plot(g["t"], g["mean_cost"], color=colour[arm], ls=style[arm], lw=1.3)
            smooth = g["lambda"].replace(np.inf, np.nan).rolling(window, min_periods=1).mean()
            bottom.plot(g["t"], smooth, color=colour[arm], ls=style[arm], lw=1.3)
            settled += list(g.loc[g["t"] >= min(window, len(g) // 2), "mean_cost"].agg(["min", "max"]))
        top.axhline(tau, color="black", ls="--", lw=1.0)
        rows = report[report["scenario"] == scenario]
        if any(f is False for f in rows.loc[rows["arm"] == "oracle", "feasible"]):
            bottom.text(0.02, 0.97, "oracle: no fixed $\\lambda$ holds $\\tau$", transform=bottom.transAxes,
                        va="top", fontsize="small", bbox={"fc": "white", "ec": "none", "alpha": 0.8})
        row = rows.iloc[0]
        shifted = {True: "shifted", False: "not shifted"}.get(row["shifted"], "shift unknown")
        auc = f"AUC {float(row['auc']):.2f}, " if pd.notna(row["auc"]) else ""
        top.set_title(f"{scenario}\n({auc}{shifted})")
        bottom.set_xlabel("visit t")
    low, high = min(settled), max(settled)
    axes[0, 0].set_ylim(low - 0.1 * (high - low + 1e-9), high + 0.1 * (high - low + 1e-9))
    axes[0, 0].set_ylabel("running mean cost")
    axes[1, 0].set_ylabel(f"$\\lambda_t$ (mean of the last {window} visits)")
    handles = [Line2D([], [], color=colour[a], ls=style[a], lw=1.5, label=arm_label(a, eta[a], tex=True))
               for a in arms]
    handles.append(Line2D([], [], color="black", ls="--", lw=1.0, label=f"$\\tau$ = {tau:g}"))
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 4), frameon=False)
    return fig


def figure(args, opts: FigureSettings, lam: dict | None) -> Drawn:
    """--report (the deployment report.csv of the scalar lambda, checked against --lambda-json when given) and its
    --traces drawn; the report's scenarios and arms are part of what the figure shows."""
    from lara.calibrate.record import read_lambda
    from lara.evaluate import deployment_report as dr

    report = dr.read_report(args.report, read_lambda(args.lambda_json) if args.lambda_json else None)
    if "constraint" in report.columns:  # its rows are per constraint, each against its own tau: not these panels
        raise dr.DataError(f"--report {args.report}: a report of the vector deployment (one row per arm and "
                           "constraint, deployment.follows: constraints); --kind deployment draws a scalar one")
    fig = deployment(report, dr.read_traces(args.traces, report, args.report), opts)
    return Drawn(fig, dr.shows(report))
