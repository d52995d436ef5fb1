"""``lara figure --kind coverage``: the coverage study (``lara coverage``): per procedure, the violation rate
against the calibration size n and the reward given up."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lara.evaluate.figures.common import Drawn, FigureSettings, check_record, panels


def coverage(cov: dict, opts: FigureSettings):
    """The coverage study (lara.calibrate.coverage): per procedure, the violation rate against the calibration
    size n with its Clopper-Pearson 95 % interval (LTT's delta dotted), and the reward given up against the
    population's own smallest feasible lambda. The largest K of the study."""
    pal, fig, axes = panels(opts, 1, 2, height=0.6)
    rows = pd.DataFrame(cov["summary"])
    rows = rows[rows["k"] == rows["k"].max()]
    names = {"bootstrap": "bootstrap $\\lambda^*$", "crc": "CRC", "ltt": "LTT (Hoeffding-Bentkus)",
             "ltt_wsr": "LTT (betting)"}
    for i, (proc, g) in enumerate(rows.groupby("procedure", sort=False)):
        g = g.sort_values("n")
        shift = np.exp((i - 1) * 0.04)  # side by side at one n, not on top of each other
        axes[0].errorbar(g["n"] * shift, g["violation_rate"], fmt="-o", color=pal[i], capsize=3,
                         label=names.get(proc, proc),
                         yerr=[g["violation_rate"] - g["violation_lo"], g["violation_hi"] - g["violation_rate"]])
        axes[1].plot(g["n"] * shift, g["reward_given_up"], "-o", color=pal[i], label=names.get(proc, proc))
    delta = cov["settings"].get("delta")
    if delta is not None:
        axes[0].axhline(delta, color=pal[2], ls=":", lw=1.2, label=f"LTT's $\\delta$ = {delta:g}")
    for ax in axes:
        ax.set(xscale="log", xlabel="calibration prompts n")
        ax.set_xticks(sorted(rows["n"].unique()), [str(n) for n in sorted(rows["n"].unique())])
        ax.minorticks_off()
    axes[1].axhline(0.0, color="black", lw=0.8)
    p = cov["population"]
    axes[0].set(ylabel="P(population cost > $\\tau$)",
                title=f"violation rate ({int(rows['repeats'].iloc[0])} draws per n)")
    axes[1].set(ylabel="reward given up",
                title=f"against $\\lambda_{{pop}}$ = {p['lambda_pop']:.3g} ({p['n_prompts']:,} prompts)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False)
    return fig


def read_coverage(path: str) -> dict:
    """coverage.json (lara coverage) with a summary whose numbers are finite."""
    import math

    from lara.read.files import DataError, json_file

    cov = json_file(path, mapping=False)  # any other top level is "no coverage summary" below
    keys = ("n", "k", "repeats", "violation_rate", "violation_lo", "violation_hi", "reward_given_up")
    rows = cov.get("summary") if isinstance(cov, dict) else None
    if not rows or not all(isinstance(r.get(k), int | float) and math.isfinite(r[k]) for r in rows for k in keys):
        raise DataError(f"{path}: no coverage summary with finite {', '.join(keys)}; rerun `lara coverage`")
    if not isinstance((cov.get("population") or {}).get("lambda_pop"), int | float):
        raise DataError(f"{path}: no scalar population lambda (a vector study, lara coverage-vector?); this figure "
                        "draws lara coverage's study of the one cost")
    return cov


def figure(args, opts: FigureSettings, lam: dict | None) -> Drawn:
    """--coverage (coverage.json) drawn; --lambda-json, when given, is full Best-of-N's record of the study's tau
    and N."""
    cov = read_coverage(args.coverage)
    check_record(lam, args.lambda_json, cov.get("tau"), (cov.get("settings") or {}).get("bon_n"),
                 f"--coverage {args.coverage} (lara coverage)")
    return Drawn(coverage(cov, opts))
