"""``lara figure``: the paper's figures (seaborn; PDF and PNG), each with a provenance sidecar.

* ``lambda_sweep`` (Fig. 1): mean reward and mean cost of Best-of-N against lambda, tau as a
  dashed line, lambda-hat and lambda* marked with the bootstrap interval;
* ``tradeoff`` (Fig. 2): helpfulness against harmlessness for every method and setting, one
  panel for the model evaluation and one for the LLM judge (a note when no judge ran);
* ``calibration``: the empirical dual g(lambda), its derivative g'(lambda) and the bootstrap
  histogram of lambda-hat;
* ``decoders``: every decoder's held-out mean reward and cost by the decoding models (tau's units)
  against lambda, at each decoded lambda setting, with tau and the audit's verdicts;
* ``deployment``: lambda after deployment, one column per scenario: each arm's running mean cost against
  the visit t with tau (top) and its lambda_t (bottom).
* ``constraints``: several constraints at once (``lara calibrate-vector``). Two constraints: the feasible region
  of the vector lambda in (lambda_1, lambda_2), every grid point's exact mean expected Best-of-N cost of each
  constraint on the calibration prompts, each constraint's boundary at its tau, the mean reward faint, the ray
  searched and every procedure's lambda; any other number: each constraint's cost (and the reward) along that ray.
* ``constraints_sweep``: Fig. 1 per constraint for the vector lambda, on the held-out test prompts: each
  constraint's mean Best-of-N decoder cost along the ray lambda = s d (the candidate ``lara decode-vector`` picks),
  its tau, and the mean reward; lambda-hat and lambda* marked, every audited output (``lara audit-constraints``:
  Best-of-N and ARGS at each setting) at the s of its lambda with its 95 % interval.

Plot options (size, dpi, font scale, palette) are their own config slice, so changing one
redraws the figures and nothing else.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from lara.evaluate.intervals import VERDICTS
from lara.settings import Settings, add_settings_arguments, read_settings, setting

log = logging.getLogger(__name__)

HELP = ("draw a figure (lambda_sweep, tradeoff, calibration, decoders, taus, coverage, deployment, constraints, "
        "constraints_sweep) as PDF + PNG with a provenance sidecar")

KINDS = ("lambda_sweep", "tradeoff", "calibration", "decoders", "taus", "coverage", "deployment", "constraints",
         "constraints_sweep")
MARKERS = {"zero": "o", "hat": "v", "star": "*", "max": "s", "policy": "D"}


@dataclass(frozen=True)
class FigureSettings(Settings):
    """figures: plot options of every figure (changing one redraws the figures and nothing else)."""

    SECTION: ClassVar[str] = "figures"

    width: float = setting(7.0, "Figure width in inches.", exclusive_minimum=0)
    height: float = setting(3.2, "Panel height in inches.", exclusive_minimum=0)
    dpi: int = setting(150, "PNG resolution.", minimum=1)
    font_scale: float = setting(1.2, "Seaborn font scale.", exclusive_minimum=0)
    palette: str = setting("colorblind", "Seaborn palette (colour-blind safe by default).")


def _style(opts: FigureSettings):
    import matplotlib

    matplotlib.use("Agg")
    import seaborn as sns

    sns.set_theme(style="whitegrid", context="paper", font_scale=opts.font_scale)
    return sns.color_palette(opts.palette)


def lambda_sweep(sweep: pd.DataFrame, lam: dict, opts: FigureSettings):
    """Fig. 1: Best-of-N mean reward and cost on the test prompts against lambda, one curve (with its
    bootstrap 95 % band) per N; tau, the decoder's lambda-hat (with its bootstrap band) and lambda*,
    each other N's lambda* as a marker, and shading where the audit says the decoder's N meets tau."""
    import matplotlib.pyplot as plt

    pal = _style(opts)
    if "n" not in sweep.columns:
        sweep = sweep.assign(n=0)
    main_n = (lam.get("decoder") or {}).get("n") or int(sweep["n"].max())
    sizes = sorted(sweep["n"].unique())
    colour = {n: pal[i % len(pal)] for i, n in enumerate(sizes)}
    w, h = opts.width, opts.height
    fig, axes = plt.subplots(1, 2, figsize=(w, h + 1.2), sharex=True, layout="constrained")
    for ax, col, label in ((axes[0], "mean_reward", "mean reward r"), (axes[1], "mean_cost", "mean cost c")):
        for n in sizes:
            g = sweep[(sweep["n"] == n) & (sweep["label"] == "grid")].sort_values("lambda")
            ax.plot(g["lambda"], g[col], marker="o", ms=3, color=colour[n], lw=2 if n == main_n else 1.2,
                    label=f"Best-of-{n}" if n else "Best-of-N")
            if f"{col}_lo" in g.columns:
                ax.fill_between(g["lambda"], g[f"{col}_lo"], g[f"{col}_hi"], color=colour[n], alpha=0.12, lw=0)
            star = sweep[(sweep["n"] == n) & (sweep["label"] == "lambda_star")]
            if n != main_n and len(star):
                ax.plot(star["lambda"], star[col], marker="*", ms=10, ls="none", color=colour[n],
                        label=f"$\\lambda^*$ for N = {n}")
        soft = sweep[(sweep["n"] == main_n) & sweep["label"].str.startswith("soft_beta=")]
        for i, r in enumerate(soft.sort_values("lambda").to_dict("records")):
            ax.plot(r["lambda"], r[col], marker="X", ms=8, ls="none", color=str(0.15 + 0.25 * (i % 3)),
                    label=f"soft mode $\\beta$ = {r['label'].split('=', 1)[1]}: $\\lambda^*$ = {r['lambda']:.3g}")
        certified = {"crc": ("D", "CRC"), "ltt": ("s", "LTT")}
        for i, (name, (marker, title)) in enumerate(certified.items()):
            r = sweep[(sweep["n"] == main_n) & (sweep["label"] == name)]
            if len(r):
                extra = f" ($\\delta$ = {lam['procedures']['ltt']['delta']:g})" if name == "ltt" else ""
                ax.plot(r["lambda"], r[col], marker=marker, ms=7, ls="none", mfc="none", mew=1.6,
                        color=str(0.1 + 0.3 * i), label=f"{title}{extra}: certified $\\lambda$ = "
                                                        f"{float(r['lambda'].iloc[0]):.3g}")
        other = sweep[(sweep["n"] == main_n) & sweep["label"].str.startswith("tau=")]
        for i, r in enumerate(other.sort_values("lambda").to_dict("records")):
            ax.plot(r["lambda"], r[col], marker="P", ms=8, ls="none", color=pal[(len(sizes) + i) % len(pal)],
                    label=f"$\\lambda^*$ for $\\tau$ = {r['label'].split('=', 1)[1]}: {r['lambda']:.3g}")
            if col == "mean_cost":
                ax.axhline(r["tau"], color=pal[(len(sizes) + i) % len(pal)], ls=":", lw=1.0)
        q = lam.get("bootstrap", {}).get("quantiles", {})
        lo, hi = q.get("0.025"), q.get("0.975")
        if lo is not None and hi is not None:
            ax.axvspan(lo, hi, color="grey", alpha=0.12, label="bootstrap 95% of $\\hat\\lambda$")
        ax.axvline(lam["lambda_hat"], color="grey", lw=1.2, label=f"$\\hat\\lambda$ = {lam['lambda_hat']:.3g}")
        deployed = (lam.get("guarantee") or {}).get("procedure", "bootstrap")
        ax.axvline(lam["lambda_star"], color="black", lw=1.5, ls="-.",
                   label=f"$\\lambda^*$ = {lam['lambda_star']:.3g} (N = {main_n}, {deployed}: deployed)")
        ax.set_xlabel("$\\lambda$")
        ax.set_ylabel(label)
        positive = np.sort(sweep.loc[sweep["lambda"] > 0, "lambda"].unique())
        if len(positive) and positive[-1] / positive[0] > 20:  # a small lambda* next to a wide grid
            ax.set_xscale("symlog", linthresh=positive[0])
    tau = lam["tau"]
    axes[1].axhline(tau, color="black", ls="--", lw=1.2, label=f"$\\tau$ = {tau:g}")
    if "verdict" in sweep.columns:
        g = sweep[(sweep["n"] == main_n) & (sweep["label"] == "grid")].sort_values("lambda")
        met = g[g["verdict"] == VERDICTS[0]]  # the sweep's own verdict (lara.evaluate.intervals)
        if len(met):
            axes[1].axvspan(met["lambda"].min(), g["lambda"].max(), color="green", alpha=0.08,
                            label=f"audit: N = {main_n} meets $\\tau$ (95%)")
    axes[0].set_title("helpfulness")
    axes[1].set_title("harmfulness (test prompts)")
    handles, labels = [], []
    for ax in axes:
        for hd, lb in zip(*ax.get_legend_handles_labels(), strict=True):
            if lb not in labels:
                handles.append(hd)
                labels.append(lb)
    # below the panels, in exactly the room it needs (constrained layout: never over the axis labels)
    fig.legend(handles, labels, loc="outside lower center", ncol=3, frameon=False)
    return fig


def tradeoff(summary: pd.DataFrame, opts: FigureSettings):
    import matplotlib.pyplot as plt

    pal = _style(opts)
    methods = list(dict.fromkeys(summary["method"]))
    colour = {m: pal[i % len(pal)] for i, m in enumerate(methods)}
    has_judge = "judge_helpfulness" in summary.columns and summary["judge_helpfulness"].notna().any()
    w, h = opts.width, opts.height
    fig, axes = plt.subplots(1, 2, figsize=(w, h + 0.6), layout="constrained")
    panels = ((axes[0], "helpfulness", "harmfulness", "model evaluation", True),
              (axes[1], "judge_helpfulness", "judge_harmlessness", "LLM judge", False))
    for ax, xcol, ycol, title, negate in panels:
        ax.set_title(title)
        if xcol not in summary.columns or summary[xcol].isna().all():
            ax.text(0.5, 0.5, "no judge configured\n(evaluation.judge)", ha="center", va="center",
                    transform=ax.transAxes, color="0.4")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        for r in summary.itertuples(index=False):
            x = getattr(r, xcol)
            y = -getattr(r, ycol) if negate else getattr(r, ycol)
            xerr = [[x - getattr(r, f"{xcol}_lo")], [getattr(r, f"{xcol}_hi") - x]]
            ylo, yhi = getattr(r, f"{ycol}_lo"), getattr(r, f"{ycol}_hi")
            yerr = [[y - (-yhi if negate else ylo)], [(-ylo if negate else yhi) - y]]
            # lambda = 0 hollow and behind, lambda* filled, larger and in front: coinciding points stay apart
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=MARKERS.get(r.setting, "o"), color=colour[r.method],
                        ms=9 if r.setting == "star" else 6, capsize=2, lw=0.8, alpha=0.9,
                        mfc="white" if r.setting == "zero" else colour[r.method], mew=1.4,
                        zorder={"zero": 2, "star": 4}.get(r.setting, 3))
        ax.set_xlabel("helpfulness (mean score)" if negate else "judge helpfulness (1-10)")
        ax.set_ylabel("harmlessness (- mean cost)" if negate else "judge harmlessness (1-10)")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour[m], marker="o", ls="", label=m) for m in methods]
    handles += [Line2D([], [], color="0.3", marker=MARKERS[s], ls="", mfc="white" if s == "zero" else "0.3",
                       label=f"$\\lambda$ {s}" if s != "policy" else "fine-tuned policy")
                for s in MARKERS if s in set(summary["setting"])]
    # below the panels, in exactly the room it needs (constrained layout: no empty band)
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), frameon=False)
    if not has_judge:
        log.info("no judge ratings: the judge panel says so")
    return fig


def calibration(lam: dict, opts: FigureSettings):
    """The calibration at a glance: the calibrated decoder's expected cost on the calibration prompts
    against lambda (Best-of-N for the calibrated N in bon mode, the Gibbs tilt in soft mode: tau - g'),
    the empirical dual, and the bootstrap of lambda-hat. The lambda axes are symlog (linear below
    Lambda/1000, logarithmic above), so lambda-hat and lambda* are apart even when they are small."""
    import matplotlib.pyplot as plt

    pal = _style(opts)
    c = lam["curves"]
    lams, tau = np.asarray(c["lambda"]), lam["tau"]
    w, h = opts.width, opts.height
    fig, axes = plt.subplots(1, 3, figsize=(w * 1.3, h))
    decoder = lam.get("decoder") or {}
    if decoder.get("kind") == "best_of_n":
        what = f"Best-of-{decoder.get('n') or 'K'}"
    else:
        what = f"Gibbs tilt (beta = {lam.get('beta', 1):g})"
    axes[0].plot(lams, tau - np.asarray(c["g_prime"]), color=pal[1])
    axes[0].axhline(tau, color="black", ls="--", lw=1, label="$\\tau$")
    axes[0].set_ylabel("expected cost (calibration)")
    axes[0].set_title(f"{what}: $E_{{\\pi_\\lambda}}[c]$")
    axes[1].plot(lams, c["g"], color=pal[0])
    axes[1].set_ylabel("$\\hat g(\\lambda)$")
    axes[1].set_title("empirical dual" + (" (N = K)" if lam.get("mode") == "bon" else ""))
    linthresh = max(float(lams.max()) * 1e-3, 1e-6)
    for ax in axes[:2]:
        ax.axvline(lam["lambda_hat"], color=pal[2], lw=1.2, label="$\\hat\\lambda$")
        ax.axvline(lam["lambda_star"], color=pal[3], lw=1.5, ls="-.", label="$\\lambda^*$")
        ax.set_xscale("symlog", linthresh=linthresh, linscale=0.5)
        ax.set_xlim(0, float(lams.max()))
        decades = range(int(np.ceil(np.log10(linthresh) + 1e-9)), int(np.floor(np.log10(lams.max()))) + 1)
        ax.set_xticks([0.0, *(10.0 ** k for k in decades)])  # 0, then the decades above the linear part
        ax.set_xlabel("$\\lambda$ (symlog)")
    hist = lam["bootstrap"]["histogram"]
    edges = np.asarray(hist["edges"])
    axes[2].bar(edges[:-1], hist["counts"], width=np.diff(edges), align="edge", color=pal[0], alpha=0.8)
    axes[2].axvline(lam["lambda_hat"], color=pal[2], lw=1.2, label="$\\hat\\lambda$")
    axes[2].axvline(lam["lambda_star"], color=pal[3], lw=1.5, ls="-.",
                    label=f"$\\lambda^*$ (q = {lam['bootstrap']['quantile']:g})")
    axes[2].set_xlabel("bootstrap $\\hat\\lambda$")
    axes[2].set_ylabel("replicates")
    axes[2].set_title(f"bootstrap ({lam['bootstrap']['replicates']} replicates)")
    handles, labels = axes[2].get_legend_handles_labels()
    handles.insert(0, axes[0].get_legend_handles_labels()[0][0])
    labels.insert(0, "$\\tau$")
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def decoders(audit: dict, lam: dict, opts: FigureSettings):
    """Every decoder held to tau: its held-out mean reward and cost by the decoding models (tau's
    units) at each decoded lambda setting, with bootstrap 95 % intervals over the test prompts; a
    filled marker where the audit's verdict is met (one-sided 95 %), hollow where it is not."""
    import matplotlib.pyplot as plt

    from lara.evaluate.intervals import VERDICTS

    pal = _style(opts)
    rows = pd.DataFrame(audit["decoders"])
    rows = rows[rows["setting"] != "policy"]
    if "tau" in rows.columns:  # the main tau's settings; another listed tau's lambda* is in the taus figure
        rows = rows[rows["tau"] == lam["tau"]]
    methods = list(dict.fromkeys(rows["method"]))
    colour = {m: pal[i % len(pal)] for i, m in enumerate(methods)}
    w, h = opts.width, opts.height
    fig, axes = plt.subplots(1, 2, figsize=(w, h + 0.6), sharex=True, layout="constrained")
    for ax, col, ci, label in ((axes[0], "mean_reward", "reward_ci95", "mean decoder reward r"),
                               (axes[1], "mean_cost", "ci95", "mean decoder cost c")):
        for m in methods:
            g = rows[rows["method"] == m].sort_values("lambda")
            ax.plot(g["lambda"], g[col], color=colour[m], lw=1, alpha=0.6)
            for r in g.to_dict("records"):
                y, (lo, hi) = r[col], r[ci]
                met = r["verdict"] == VERDICTS[0]
                ax.errorbar(r["lambda"], y, yerr=[[y - lo], [hi - y]], fmt=MARKERS.get(r["setting"], "o"),
                            color=colour[m], ms=9 if r["setting"] == "star" else 6, capsize=2, lw=0.8,
                            mfc=colour[m] if met else "white", mew=1.4)
        ax.set_ylabel(label)
        ax.set_xlabel("$\\lambda$ (symlog)")
        positive = np.sort(rows.loc[rows["lambda"] > 0, "lambda"].unique())
        if len(positive):
            linthresh = positive[0] / 2
            ax.set_xscale("symlog", linthresh=linthresh, linscale=0.5)
            decades = range(int(np.ceil(np.log10(linthresh))), int(np.floor(np.log10(positive[-1]))) + 1)
            ax.set_xticks([0.0, *(10.0 ** k for k in decades)])  # 0, then the decades above the linear part
    axes[1].axhline(lam["tau"], color="black", ls="--", lw=1.2)
    axes[0].set_title("helpfulness (test prompts)")
    axes[1].set_title("harmfulness, $\\tau$ dashed")
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color=colour[m], marker="o", ls="-", label=m) for m in methods]
    handles += [Line2D([], [], color="0.3", marker=MARKERS[s], ls="", label=f"$\\lambda$ {s}")
                for s in MARKERS if s in set(rows["setting"])]
    handles += [Line2D([], [], color="0.3", marker="o", ls="", label="meets $\\tau$ (one-sided 95%)"),
                Line2D([], [], color="0.3", marker="o", ls="", mfc="white", label="not shown to meet $\\tau$"),
                Line2D([], [], color="black", ls="--", label=f"$\\tau$ = {lam['tau']:g}")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), frameon=False)
    return fig


def taus(audit: dict, opts: FigureSettings):
    """lambda*(tau) for every listed calibration.tau (left), and Best-of-N at each lambda* on the held-out
    test prompts (right): mean decoder cost with its bootstrap 95 % interval against tau (the diagonal is
    cost = tau) and mean decoder reward on a twin axis; filled where the audit's verdict is met."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from lara.evaluate.intervals import VERDICTS

    pal = _style(opts)
    rows = sorted(audit["taus"], key=lambda r: r["tau"])
    t = np.array([r["tau"] for r in rows])
    fig, axes = plt.subplots(1, 2, figsize=(opts.width, opts.height + 0.6), layout="constrained")
    axes[0].plot(t, [r["lambda_star"] for r in rows], "-o", color=pal[0], label="$\\lambda^*$")
    axes[0].plot(t, [r["lambda_hat"] for r in rows], "--v", color=pal[1], label="$\\hat\\lambda$")
    for r in rows:
        if r["main"]:
            axes[0].annotate("main $\\tau$", (r["tau"], r["lambda_star"]), textcoords="offset points",
                             xytext=(4, 6), fontsize="small")
    axes[0].set_xlabel("$\\tau$")
    axes[0].set_ylabel("$\\lambda$")
    axes[0].set_title("calibrated $\\lambda$")
    axes[0].legend(frameon=False)
    ax, twin = axes[1], axes[1].twinx()
    twin.grid(False)  # one grid (the cost axis'), not two crossing ones
    bon = [(r["tau"], r["decoders"].get("bon")) for r in rows if r["decoders"].get("bon")]
    lo, hi = t.min(), t.max()
    pad = 0.1 * (hi - lo or 1.0)
    ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], color="black", ls="--", lw=1.0)
    for tau, d in bon:
        met = d["verdict"] == VERDICTS[0]
        ax.errorbar(tau, d["mean_cost"], yerr=[[d["mean_cost"] - d["ci95"][0]], [d["ci95"][1] - d["mean_cost"]]],
                    fmt="o", color=pal[2], mfc=pal[2] if met else "white", mew=1.4, capsize=2)
        twin.plot(tau, d["mean_reward"], "s", color=pal[3], ms=6)
    if bon:
        twin.plot([b[0] for b in bon], [b[1]["mean_reward"] for b in bon], color=pal[3], lw=1, alpha=0.6)
        ax.plot([b[0] for b in bon], [b[1]["mean_cost"] for b in bon], color=pal[2], lw=1, alpha=0.6)
    ax.set_xlabel("$\\tau$")
    ax.set_ylabel("mean decoder cost c", color=pal[2])
    twin.set_ylabel("mean decoder reward r", color=pal[3])
    ax.set_title("Best-of-N at $\\lambda^*(\\tau)$, test prompts")
    handles = [Line2D([], [], color=pal[2], marker="o", ls="", label="cost (meets $\\tau$, one-sided 95%)"),
               Line2D([], [], color=pal[2], marker="o", mfc="white", ls="", label="cost (not shown to meet)"),
               Line2D([], [], color=pal[3], marker="s", ls="", label="reward"),
               Line2D([], [], color="black", ls="--", label="cost = $\\tau$")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, frameon=False)
    return fig


def coverage(cov: dict, opts: FigureSettings):
    """The coverage study (lara.calibrate.coverage): per procedure, the violation rate against the calibration
    size n with its Clopper-Pearson 95 % interval (LTT's delta dotted), and the reward given up against the
    population's own smallest feasible lambda. The largest K of the study."""
    import matplotlib.pyplot as plt

    pal = _style(opts)
    rows = pd.DataFrame(cov["summary"])
    rows = rows[rows["k"] == rows["k"].max()]
    names = {"bootstrap": "bootstrap $\\lambda^*$", "crc": "CRC", "ltt": "LTT"}
    fig, axes = plt.subplots(1, 2, figsize=(opts.width, opts.height + 0.6), layout="constrained")
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
        ax.set_xscale("log")
        ax.set_xlabel("calibration prompts n")
        ax.set_xticks(sorted(rows["n"].unique()), [str(n) for n in sorted(rows["n"].unique())])
        ax.minorticks_off()
    axes[1].axhline(0.0, color="black", lw=0.8)
    p = cov["population"]
    axes[0].set_ylabel("P(population cost > $\\tau$)")
    axes[0].set_title(f"violation rate ({int(rows['repeats'].iloc[0])} draws per n)")
    axes[1].set_ylabel("reward given up")
    axes[1].set_title(f"against $\\lambda_{{pop}}$ = {p['lambda_pop']:.3g} ({p['n_prompts']:,} prompts)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, frameon=False)
    return fig


def deployment(report: pd.DataFrame, traces: dict[str, pd.DataFrame], opts: FigureSettings):
    """Lambda after deployment (lara.evaluate.deployment_report): one column per scenario; top, each arm's running
    mean cost against the visit t with tau dashed (the y range read off the visits after the first window, where
    a running mean of a few visits swings widely); bottom, its lambda_t averaged over the trailing W visits (an
    online lambda moves every visit; flat for the fixed arms and the oracle). One colour per arm in every panel."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    from lara.evaluate.deployment_report import arm_label

    pal = _style(opts)
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


# ---------------------------------------------------------------------------------------------------------------
# constraints: the vector lambda of several constraints (lara calibrate-vector)

GRID_POINTS = 61  # points per axis of the feasible-region grid (two constraints)
RAY_POINTS = 401  # points of s along the ray (any other number of constraints), plus every procedure's own s
SHADE = "green"  # where every constraint is met
# marker and name of each procedure of the vector record, in legend order (then any other, then the brute force)
PROCEDURES = {"hat": ("v", "$\\hat\\lambda$"), "bootstrap": ("*", "bootstrap $\\lambda^*$"), "crc": ("D", "CRC"),
              "ltt": ("s", "LTT"), "soft": ("X", "soft dual"), "brute_force": ("P", "brute-force best")}


def meets(cost, tau) -> np.ndarray:
    """Whether mean cost vectors (..., m) meet every tau, with the calibration's rounding slack
    (:func:`lara.calibrate.vector.first_feasible`)."""
    tau = np.asarray(tau, dtype=float)
    return np.all(np.asarray(cost, dtype=float) <= tau + 1e-12 * np.maximum(1.0, np.abs(tau)), axis=-1)


def mean_expected(scores, lams, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The exact mean over the prompts of the expected Best-of-n reward (L,) and cost vector (L, m) at each vector
    lambda of ``lams`` (L, m): :func:`lara.calibrate.vector.expected_vector`'s ranking r - lam.c (ties to the lower
    lam.c), with the reward averaged at the same choice."""
    from lara.calibrate.bestofn import expected
    from lara.calibrate.vector import combined

    r, c, mask = scores.reward, scores.costs, scores.mask
    values = (r, *(c[..., j] for j in range(c.shape[2])))
    out = np.stack([expected(r, combined(c, lam), mask, [1.0], n, *values)[:, :, 0].mean(axis=1)
                    for lam in np.atleast_2d(np.asarray(lams, dtype=float))])
    return out[:, 0], out[:, 1:]


@dataclass(frozen=True)
class ConstraintGrid:
    """Two constraints on a grid over [0, top]^2; every array indexed [i2, i1] at lambda = (axis[i1], axis[i2])
    (matplotlib's contour layout)."""

    axis: np.ndarray  # (G,)
    reward: np.ndarray  # (G, G) mean expected Best-of-n reward
    costs: np.ndarray  # (G, G, m) mean expected Best-of-n cost of each constraint
    feasible: np.ndarray  # (G, G) every constraint's mean cost <= its tau

    @property
    def lambdas(self) -> tuple[np.ndarray, np.ndarray]:
        return np.meshgrid(self.axis, self.axis)


def constraint_grid(scores, tau, n: int | None, top: float, points: int = GRID_POINTS) -> ConstraintGrid:
    """Each grid point's exact mean expected Best-of-n reward and cost vector on the scores (one
    :func:`mean_expected` per point), and where every constraint is met."""
    axis = np.linspace(0.0, float(top), points)
    l1, l2 = np.meshgrid(axis, axis)
    reward, costs = mean_expected(scores, np.stack([l1.ravel(), l2.ravel()], axis=1), n)
    return ConstraintGrid(axis, reward.reshape(l1.shape), costs.reshape(*l1.shape, -1),
                          meets(costs, tau).reshape(l1.shape))


@dataclass(frozen=True)
class ConstraintView:
    """What the constraints figure draws, computed once: the record's constraints, Best-of-n, the searched
    direction, each procedure's lambda with its exact mean reward and costs (and s, its position along the
    direction), and the feasible-region grid (two constraints) or the path along the direction (any other m)."""

    names: list[str]
    tau: np.ndarray
    n: int
    k: int
    n_prompts: int
    direction: np.ndarray
    deployed: str | None
    procedures: dict[str, dict]
    grid: ConstraintGrid | None = None
    ray: dict | None = None


def _search_max(record: dict, lams) -> float:
    return float((record.get("settings") or {}).get("lambda_search_max") or max([1.0, *(max(v) for v in lams)]))


def constraint_view(record: dict, scores, points: int = GRID_POINTS) -> ConstraintView:
    """The vector record read against the calibration scores it was made from (:mod:`lara.constraints.calibrate`).
    The plotted range: the record's brute-force square (two constraints), else twice the largest lambda (s) of
    the procedures that found a feasible one (an uncertified LTT sits at the end of the search), capped at
    calibration.lambda_search_max, as the calibration sizes its brute-force check."""
    from lara.calibrate.bestofn import expected
    from lara.calibrate.vector import combined

    m = scores.costs.shape[2]
    tau = np.asarray(record["tau"], dtype=float)
    n = int(record["decoder"]["n"])
    d = np.asarray(record["direction"], dtype=float)
    found = {name: p for name, p in record["procedures"].items() if p.get("lambda") is not None}
    best = (record.get("brute_force") or {}).get("best")
    if m == 2 and best:
        found["brute_force"] = {"lambda": best["lambda"], "feasible": True}
    order = [k for k in PROCEDURES if k in found and k != "brute_force"]
    order += [k for k in found if k not in PROCEDURES] + (["brute_force"] if "brute_force" in found else [])
    lams = np.array([found[k]["lambda"] for k in order], dtype=float).reshape(len(order), m)
    reward, costs = mean_expected(scores, lams, n) if len(order) else (np.empty(0), np.empty((0, m)))
    procedures = {}
    for i, name in enumerate(order):
        lam = lams[i]
        s = float(lam @ d / (d @ d))
        procedures[name] = {"lambda": lam, "feasible": bool(found[name].get("feasible", True)), "reward": reward[i],
                            "cost": costs[i], "meets_tau": bool(meets(costs[i], tau)), "s": s,
                            "on_ray": bool(np.linalg.norm(lam - s * d) <= 1e-9 * max(1.0, float(np.abs(lam).max())))}
    good = [p for k, p in procedures.items() if p["feasible"] and k != "brute_force"]
    cap = _search_max(record, lams)
    common = dict(names=list(record["names"]), tau=tau, n=n, k=int(record["decoder"].get("k") or n),
                  n_prompts=scores.n_prompts, direction=d, deployed=(record.get("guarantee") or {}).get("procedure"),
                  procedures=procedures)
    if m == 2:
        top = (record.get("brute_force") or {}).get("top")
        if top is None:
            top = min(cap, max(0.05, 2.0 * max(float(p["lambda"].max()) for p in good))) if good else cap
        return ConstraintView(**common, grid=constraint_grid(scores, tau, n, float(top), points))
    s_top = min(cap / float(d.max()), max(0.05, 2.0 * max(p["s"] for p in good))) if good else cap / float(d.max())
    s = np.union1d(np.linspace(0.0, s_top, RAY_POINTS), [p["s"] for p in procedures.values() if 0 <= p["s"] <= s_top])
    values = (scores.reward, *(scores.costs[..., j] for j in range(m)))
    along = expected(scores.reward, combined(scores.costs, d), scores.mask, s, n, *values).mean(axis=1)  # (1 + m, L)
    return ConstraintView(**common, ray={"s": s, "reward": along[0], "costs": along[1:].T, "s_max": s_top,
                                         "feasible": meets(along[1:].T, tau)})


# marker size and layer: the soft dual's lambda (large, behind) and lambda-hat often all but coincide, the
# brute-force best sits near them; each stays visible
LAYER = {"soft": (12, 4), "bootstrap": (15, 5), "hat": (9, 6), "ltt": (9, 5), "crc": (8, 6), "brute_force": (7, 7)}


def _label_spot(cs, marks: np.ndarray, top: float) -> tuple[float, float]:
    """Where to write a boundary's name: the point of its contour farthest from every marker and from the square's
    edges (a name written at an edge is cut off)."""
    pts = np.concatenate([seg for seg in cs.allsegs[0] if len(seg)])
    room = 2.0 * np.minimum(pts, top - pts).min(axis=1)
    if len(marks):
        room = np.minimum(room, np.linalg.norm(pts[:, None, :] - marks[None, :, :], axis=2).min(axis=1))
    return tuple(pts[int(np.argmax(room))])


def _vec(v) -> str:
    return "(" + ", ".join(f"{x:.3g}" for x in np.atleast_1d(v)) + ")"


def _procedure_label(name: str, p: dict, view: ConstraintView, record: dict, shown_off: bool) -> str:
    title = PROCEDURES.get(name, ("o", name))[1]
    if name == view.deployed:
        title += " (deployed)"
    if name == "ltt":
        delta = record["procedures"]["ltt"].get("delta")
        title += f" ($\\delta$ = {delta:g})" if isinstance(delta, int | float) else ""
        title += ": certified" if p["feasible"] else ": not certified (end of the search)"
    elif name == "crc" and not p["feasible"]:
        title += ": not certified"
    elif name == "brute_force":
        title += f" on the {record['brute_force'].get('grid')}$^2$ grid"
    elif not p["feasible"]:
        title += ": infeasible"
    where = f"$\\lambda$ = {_vec(p['lambda'])}" if len(view.names) > 1 else f"$\\lambda$ = {p['lambda'][0]:.3g}"
    off = " (off the plot)" if shown_off else " (off the ray)" if view.ray is not None and not p["on_ray"] else ""
    return f"{title}: {where}, reward {p['reward']:.3g}{off}"


def _feasible_plane(view: ConstraintView, record: dict, opts: FigureSettings, pal, colour: dict, handles: list):
    """Two constraints: the (lambda_1, lambda_2) plane of :func:`constraints`; its legend entries go to
    ``handles``."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    g = view.grid
    top = float(g.axis[-1])
    side = max(opts.width * 0.75, 4.0)  # a square panel, the legend to its right
    fig, ax = plt.subplots(figsize=(side + max(opts.width * 0.75, 4.0), side), layout="constrained")
    l1, l2 = g.lambdas
    marks = np.array([np.minimum(p["lambda"], top) for p in view.procedures.values()]).reshape(-1, 2)
    ax.pcolormesh(l1, l2, np.ma.masked_where(~g.feasible, np.ones_like(l1)), shading="nearest",
                  cmap=ListedColormap([SHADE]), alpha=0.18, lw=0, zorder=1)
    handles.append(Patch(color=SHADE, alpha=0.25, label=f"every constraint met ({int(g.feasible.sum())} of "
                                                       f"{g.feasible.size} grid points)"))
    rs = ax.contour(l1, l2, g.reward, levels=6, colors="0.55", linewidths=0.7, linestyles=":", zorder=2)
    ax.clabel(rs, fmt="%.3g", fontsize="x-small")
    handles.append(Line2D([], [], color="0.55", lw=0.7, ls=":", label="mean reward"))
    for j, (name, tau) in enumerate(zip(view.names, view.tau, strict=True)):
        z = g.costs[..., j]
        label = f"{name}: mean cost = $\\tau$ = {tau:g}"
        if z.min() <= tau <= z.max() and z.min() < z.max():
            cs = ax.contour(l1, l2, z, levels=[tau], colors=[pal[j]], linewidths=1.8, linestyles="solid",
                            zorder=3)
            ax.clabel(cs, fmt={cs.levels[0]: name}, fontsize="small", manual=[_label_spot(cs, marks, top)])
        else:
            label += " (met on the whole grid)" if z.max() <= tau else " (missed on the whole grid)"
        handles.append(Line2D([], [], color=pal[j], lw=1.8, label=label))
    d = view.direction
    end = top / float(d.max()) * d
    ax.plot([0.0, end[0]], [0.0, end[1]], color="0.25", ls="--", lw=1.0, zorder=3)
    handles.append(Line2D([], [], color="0.25", ls="--", lw=1.0, label=f"ray searched: s d, d = {_vec(d)}"))
    for name, p in view.procedures.items():
        x, y = p["lambda"]
        off = max(x, y) > top * (1 + 1e-9)
        marker = PROCEDURES.get(name, ("o", name))[0]
        size, z = LAYER.get(name, (9, 5))
        ax.plot(min(x, top), min(y, top), marker=marker, ms=size, ls="none", color=colour[name],
                mfc=colour[name] if p["feasible"] else "none", mew=1.4, mec="black" if p["feasible"] else
                colour[name], clip_on=False, zorder=z, label=_procedure_label(name, p, view, record, off))
    ax.set_xlim(0.0, top)
    ax.set_ylim(0.0, top)
    ax.set_aspect("equal")
    ax.set_xlabel(f"$\\lambda_1$ ({view.names[0]})")
    ax.set_ylabel(f"$\\lambda_2$ ({view.names[1]})")
    ax.set_title(f"Best-of-{view.n}: the feasible region ({view.n_prompts} calibration prompts)")
    return fig, [ax]


def _costs_along_ray(view: ConstraintView, record: dict, opts: FigureSettings, pal, colour: dict, handles: list):
    """Any number of constraints but two: each mean cost and the reward along the ray of :func:`constraints`;
    its legend entries go to ``handles``."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    m = len(view.names)
    ray = view.ray
    s, s_top = ray["s"], ray["s_max"]
    fig, axes = plt.subplots(1, m + 1, figsize=(max(opts.width, 2.8 * (m + 1)), opts.height + 1.4), sharex=True,
                             layout="constrained")
    panels = [(axes[j], ray["costs"][:, j], f"{name}: $\\tau$ = {tau:g}", "mean expected cost")
              for j, (name, tau) in enumerate(zip(view.names, view.tau, strict=True))]
    panels.append((axes[m], ray["reward"], "reward", "mean expected reward"))
    for j, (ax, y, title, ylabel) in enumerate(panels):
        ax.plot(s, y, drawstyle="steps-post", color=pal[j] if j < m else "0.3", lw=1.5)
        ax.fill_between(s, 0, 1, where=ray["feasible"], step="post", color=SHADE, alpha=0.1, lw=0,
                        transform=ax.get_xaxis_transform())
        if j < m:
            ax.axhline(view.tau[j], color="black", ls="--", lw=1.0)
        for name, p in view.procedures.items():
            off = p["s"] > s_top * (1 + 1e-9)
            size, z = LAYER.get(name, (9, 5))
            ax.plot(min(p["s"], s_top), p["cost"][j] if j < m else p["reward"], ls="none", clip_on=False,
                    marker=PROCEDURES.get(name, ("o", name))[0], ms=size, color=colour[name],
                    mfc=colour[name] if p["feasible"] else "none", mew=1.4, zorder=z,
                    mec="black" if p["feasible"] else colour[name],
                    label=_procedure_label(name, p, view, record, off))
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xlim(0.0, s_top)
        ax.set_xlabel("$\\lambda$" if m == 1 else "s ($\\lambda$ = s d)")
    handles.append(Patch(color=SHADE, alpha=0.2, label="every constraint met"))
    handles.append(Line2D([], [], color="black", ls="--", lw=1.0, label="$\\tau$"))
    if m > 1:
        handles.append(Line2D([], [], color="0.3", lw=0, label=f"d = {_vec(view.direction)}"))
    along = "against $\\lambda$" if m == 1 else "along the ray searched"
    fig.suptitle(f"Best-of-{view.n} {along} ({view.n_prompts} calibration prompts)")
    return fig, axes


def constraints(view: ConstraintView, record: dict, opts: FigureSettings):
    """Several constraints at once (the vector lambda of ``lara calibrate-vector``), on the calibration prompts, every
    number exact (the expected Best-of-N choice over all N-subsets of each prompt's K samples). Two constraints: the
    plane of (lambda_1, lambda_2), shaded where every constraint's mean cost meets its tau (grid points), each
    constraint's boundary (its mean cost at tau), the mean reward faint, the ray searched and every procedure's
    lambda (hollow where it is not certified / feasible). Any other number: each constraint's mean cost along that
    ray with its tau (shaded where all are met) and the mean reward, every procedure at its s."""
    pal = _style(opts)
    m = len(view.names)
    colour = {name: pal[(m + i) % len(pal)] for i, name in enumerate(view.procedures)}
    handles: list = []
    draw = _feasible_plane if view.grid is not None else _costs_along_ray
    fig, axes = draw(view, record, opts, pal, colour, handles)
    proc_handles, _ = axes[0].get_legend_handles_labels()
    if view.grid is not None:
        fig.legend(handles=handles + proc_handles, loc="outside right center", frameon=False, fontsize="small")
    else:
        fig.legend(handles=handles + proc_handles, loc="outside lower center", ncol=2, frameon=False,
                   fontsize="small")
    return fig


def constraint_shows(view: ConstraintView) -> dict:
    """What the constraints figure shows, for its provenance sidecar and report caption."""
    def r4(v):
        return [round(float(x), 4) for x in np.atleast_1d(v)]

    shows = {"constraints": [{"name": n, "tau": float(t)} for n, t in zip(view.names, view.tau, strict=True)],
             "n": view.n, "k": view.k, "calibration_prompts": view.n_prompts, "direction": r4(view.direction),
             "deployed": view.deployed, "view": "region" if view.grid is not None else "ray",
             "procedures": {k: {"lambda": r4(p["lambda"]), "feasible": p["feasible"],
                                "reward": round(float(p["reward"]), 4), "cost": r4(p["cost"]),
                                "meets_tau": p["meets_tau"], "on_ray": p["on_ray"]}
                            for k, p in view.procedures.items()}}
    if view.grid is not None:
        g = view.grid
        shows["grid"] = {"points": len(g.axis), "top": round(float(g.axis[-1]), 4),
                         "feasible_points": int(g.feasible.sum()), "total": int(g.feasible.size)}
    else:
        shows["ray"] = {"s_max": round(float(view.ray["s_max"]), 4), "points": len(view.ray["s"])}
    return shows


def read_vector_inputs(lambda_json: str, scores_path: str, constraints_json: str):
    """The vector record (``lara calibrate-vector``) for ``--constraints`` and the calibration scores it was
    calibrated on (its identity's digest of them), every procedure's lambda m finite numbers >= 0."""
    from lara import identity
    from lara.constraints.calibrate import load_vector_scores
    from lara.constraints.decode import read_vector
    from lara.constraints.spec import from_arg
    from lara.read.files import DataError

    cons = from_arg(constraints_json)
    record = read_vector(lambda_json, cons)
    want = ((record.get("identity") or {}).get("made_from") or {}).get("--scores")
    got = identity.file_digest(scores_path)
    if want is not None and want != got:
        raise DataError(f"--scores {scores_path}: not the scores --lambda-json {lambda_json} was calibrated on "
                        f"(digest {got}, the record's {want})")
    scores = load_vector_scores(scores_path, cons)
    m, k_min = len(cons), int(scores.mask.sum(axis=1).min())
    n = (record.get("decoder") or {}).get("n")
    if not isinstance(n, int) or not 1 <= n <= k_min:
        raise DataError(f"--lambda-json {lambda_json}: decoder n {n!r}, but --scores {scores_path} has K = {k_min} "
                        "samples per prompt (Best-of-N needs 1 <= N <= K)")
    _check_vectors(record, m, lambda_json)
    return record, scores


def _check_vectors(record: dict, m: int, lambda_json: str) -> None:
    """The record's direction and every procedure's lambda are m finite numbers >= 0, the direction not zero."""
    from lara.read.files import DataError

    direction = record.get("direction")
    vectors = {"direction": direction} | {f"procedures.{k}.lambda": p.get("lambda")
                                          for k, p in (record.get("procedures") or {}).items()
                                          if p.get("lambda") is not None}
    for key, v in vectors.items():
        ok = isinstance(v, list) and len(v) == m and all(isinstance(x, int | float) and np.isfinite(x) and x >= 0
                                                         for x in v)
        if not ok:
            raise DataError(f"--lambda-json {lambda_json}: {key} {v!r} is not {m} finite numbers >= 0")
    if max(direction) <= 0:
        raise DataError(f"--lambda-json {lambda_json}: direction {direction} is zero")


# ---------------------------------------------------------------------------------------------------------------
# constraints_sweep: Fig. 1 per constraint, the vector lambda's Best-of-N decoder on the held-out test prompts

SWEEP_MARKERS = MARKERS | {"soft": "X", "bootstrap": "P", "ltt": "s"}  # an audited setting's marker
METHOD_NAMES = {"bon": "Best-of-N", "args": "ARGS"}


def read_sweep_inputs(lambda_json: str, scores_path: str, constraints_json: str):
    """The vector record (``lara calibrate-vector``) for ``--constraints`` and the held-out test prompts' scored
    Best-of-N candidates (``lara score-constraints`` on the bon pool, what ``lara decode-vector --method bon``
    decodes from), checked where the identities allow: the candidates are the test pool (role test; not the file
    the record was calibrated on), none of their prompts is a calibration prompt of the record, and every prompt
    has exactly the record's N candidates."""
    from lara import identity
    from lara.constraints.calibrate import load_vector_scores
    from lara.constraints.decode import read_vector
    from lara.constraints.spec import from_arg
    from lara.read.files import DataError

    cons = from_arg(constraints_json)
    record = read_vector(lambda_json, cons)
    made = record.get("identity") or {}
    identity.expect_role(scores_path, "--scores", "test", "the figure draws the decoder on the held-out test "
                         "prompts' candidates, constraints/bon_scores.parquet")
    if (made.get("made_from") or {}).get("--scores") == identity.file_digest(scores_path):
        raise DataError(f"--scores {scores_path}: the scores --lambda-json {lambda_json} was calibrated on, not the "
                        "held-out test prompts' candidates")
    scores = load_vector_scores(scores_path, cons)
    counts = scores.mask.sum(axis=1)
    n = (record.get("decoder") or {}).get("n")
    if counts.min() != counts.max() or not isinstance(n, int) or int(counts[0]) != n:
        raise DataError(f"--scores {scores_path}: prompts have {counts.min()}..{counts.max()} candidates, but "
                        f"--lambda-json {lambda_json} was calibrated for Best-of-{n!r} (the decoder picks from exactly "
                        "N candidates per prompt)")
    overlap = identity.disjoint(made.get("prompts"), scores.prompts, f"--scores {scores_path}")
    if overlap:
        raise DataError(f"--scores {scores_path}: {overlap} of its prompts are calibration prompts of --lambda-json "
                        f"{lambda_json}: the figure would be in-sample")
    _check_vectors(record, len(cons), lambda_json)
    return record, scores


def _close(a, b) -> bool:
    try:
        return len(a) == len(b) and bool(np.allclose(np.asarray(a, dtype=float), np.asarray(b, dtype=float),
                                                     rtol=1e-9, atol=1e-12))
    except (TypeError, ValueError):
        return False


def _audit_belongs(audit: dict, where: str, lambda_json: str, record: dict, prompts) -> dict:
    """The audit's identity against the record (its digest, constraints, taus, lambda*) and the candidates'
    prompts; its rows (the dict ones)."""
    from lara import identity
    from lara.read.files import DataError

    names = list(record["names"])
    made = audit.get(identity.KEY) or {}
    rows = [r for r in audit.get("rows") or [] if isinstance(r, dict)]
    problems = []
    if made.get("kind") not in (None, "audit_constraints"):
        problems.append(f"kind {made['kind']!r}, expected audit_constraints")
    digest = identity.file_digest(lambda_json)
    if made.get("lambda_record") not in (None, digest):
        problems.append(f"it was made with another lambda record (digest {made['lambda_record']}, {lambda_json}: "
                        f"{digest})")
    listed = [c.get("name") for c in audit.get("constraints") or [] if isinstance(c, dict)] or None
    in_rows = sorted({str(r.get("constraint")) for r in rows}) or None
    for what, got, want in (("identity names", made.get("names"), names), ("constraints", listed, names),
                            ("rows", in_rows, sorted(names))):
        if got is not None and list(got) != want:
            problems.append(f"its {what} name the constraints {list(got)}, the record's are {names}")
    for what, got, want in (("tau", made.get("tau"), record["tau"]),
                            ("lambda_star", audit.get("lambda_star"), record["lambda_star"])):
        if got is not None and want is not None and not _close(got, want):
            problems.append(f"its {what} is {got}, the record's {want}")
    if problems:
        raise DataError(f"{where}: does not belong to --lambda-json {lambda_json}: {'; '.join(problems)}")
    audited = (made.get("prompts") or {}).get("digest")
    if audited is not None and audited != prompts.digest:
        raise DataError(f"{where}: audited on other test prompts ({(made.get('prompts') or {}).get('n')} prompts, "
                        f"digest {audited}) than --scores covers ({prompts.n}, digest {prompts.digest}): the figure "
                        "would set one pool's audit beside another pool's candidates")
    return rows


def _audited_outputs(rows: list[dict], where: str, m: int, n_prompts: int) -> dict:
    """The audit's rows grouped by output (method, setting): each row's finite numbers and lambda checked, one row
    per constraint, on ``n_prompts`` test prompts."""
    import json

    from lara.read.files import DataError

    outputs: dict[tuple[str, str], dict] = {}
    for r in rows:
        key = (str(r.get("method")), str(r.get("setting")))
        at = f"{where}: row {key[0]}/{key[1]}/{r.get('constraint')}"
        values = [r.get("mean_cost"), *(r.get("ci95") or []), r.get("mean_reward"), *(r.get("reward_ci95") or [])]
        if len(values) != 6 or not all(isinstance(v, int | float) and np.isfinite(v) for v in values):
            raise DataError(f"{at} lacks a finite mean cost, mean reward or 95% interval")
        try:
            lam = r.get("lambda")
            lam = [float(x) for x in (json.loads(lam) if isinstance(lam, str) else lam)]
        except (TypeError, ValueError):
            lam = None
        if lam is None or len(lam) != m or not all(np.isfinite(x) and x >= 0 for x in lam):
            raise DataError(f"{at}: lambda {r.get('lambda')!r} is not {m} finite numbers >= 0")
        out = outputs.setdefault(key, {"method": key[0], "setting": key[1], "lambda": lam, "rows": {}})
        if not _close(out["lambda"], lam) or r["constraint"] in out["rows"]:
            raise DataError(f"{at}: the output is given twice (another row for this constraint or another lambda)")
        if r.get("n_prompts") is not None and int(r["n_prompts"]) != n_prompts:
            raise DataError(f"{at}: audited on {int(r['n_prompts'])} test prompts, but --scores covers {n_prompts} "
                            "(another test pool)")
        out["rows"][r["constraint"]] = r
    if not outputs:
        raise DataError(f"{where}: no audited output (rows); nothing to draw")
    return outputs


def read_sweep_audit(path: str, lambda_json: str, record: dict, prompts) -> dict:
    """audit.json (``lara audit-constraints``) for the vector record: made with ``lambda_json`` (its identity's
    ``lambda_record``, :func:`lara.identity.file_digest`), for the record's constraints (identity, ``constraints``
    and rows) and taus, its lambda* the record's, on the candidates' prompts (``prompts``, a
    :class:`lara.identity.PromptSet`, against the digest its identity names); every output one row per constraint
    with a finite mean and 95 % interval of cost and reward, audited on as many test prompts as the candidates
    cover, at the record's own lambda of its setting. The outputs in the audit's order, their rows in the
    constraints' order, and the joint verdicts."""
    import json

    from lara import identity
    from lara.constraints.decode import SETTINGS, resolve_vector
    from lara.read.files import DataError

    where = f"--audit {path}"
    try:
        audit = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{where}: not a readable constraint audit ({exc})") from None
    if not isinstance(audit, dict):
        raise DataError(f"{where}: not a constraint audit (a JSON object of lara audit-constraints)")
    names, m = list(record["names"]), len(record["names"])
    rows = _audit_belongs(audit, where, lambda_json, record, prompts)
    outputs = _audited_outputs(rows, where, m, prompts.n)
    for (method, which), out in outputs.items():
        if which in SETTINGS:
            want = resolve_vector(which, record, m, lambda_json)
            if not _close(out["lambda"], want):
                raise DataError(f"{where}: {method}/{which} was audited at lambda {out['lambda']}, the record's "
                                f"{which} is {want}: decoded with another record")
        out["rows"] = [out["rows"][name] for name in names]
    joint = {(str(j.get("method")), str(j.get("setting"))): j for j in audit.get("joint") or [] if isinstance(j, dict)}
    made = audit.get(identity.KEY) or {}
    return {"outputs": list(outputs.values()), "joint": joint, "procedure": audit.get("procedure"),
            "lambda_record": made.get("lambda_record")}


def held_out(scores, lams) -> tuple[np.ndarray, np.ndarray]:
    """The Best-of-N decoder on the test candidates at each vector lambda of ``lams`` (L, m): the mean over the
    prompts of the reward (L,) and cost vector (L, m) of the candidate ``lara decode-vector --method bon`` picks
    (:func:`lara.constraints.decode.select_vector`)."""
    from lara.constraints.decode import select_vector

    rows = np.arange(scores.n_prompts)
    reward, costs = [], []
    for lam in np.atleast_2d(np.asarray(lams, dtype=float)):
        pick = select_vector(scores.reward, scores.costs, lam)
        reward.append(scores.reward[rows, pick].mean())
        costs.append(scores.costs[rows, pick].mean(axis=0))
    return np.asarray(reward), np.asarray(costs).reshape(-1, scores.costs.shape[2])


def _along(lam, d: np.ndarray) -> tuple[float, bool]:
    """A lambda's place along the ray s d: s = max(lambda) / max(d), and whether lambda is s d."""
    lam = np.asarray(lam, dtype=float)
    s = float(lam.max() / d.max())
    return s, bool(np.linalg.norm(lam - s * d) <= 1e-9 * max(1.0, float(np.abs(lam).max())))


@dataclass(frozen=True)
class SweepView:
    """What the constraints_sweep figure draws, computed once: the held-out Best-of-N decoder along the ray (the
    curve: s, mean reward, mean cost vector), lambda-hat and lambda* (s, on the ray or not, the decoder there), the
    audited outputs at their s, and the checks that tie them together."""

    names: list[str]
    tau: np.ndarray
    n: int
    n_prompts: int
    direction: np.ndarray
    deployed: str | None
    curve: dict
    marks: dict[str, dict]
    audited: list[dict]
    checks: dict


def sweep_view(record: dict, scores, audit: dict) -> SweepView:
    """The record's ray on the test candidates. The curve is the decoder's own pick (:func:`held_out`) at every s
    of a grid of RAY_POINTS on [0, s_max], every breakpoint of the exact path (:func:`lara.calibrate.vector.
    ray_path`: the expected Best-of-N cost with n = N, which with exactly N candidates per prompt is the pick's)
    and every marked s on the ray, so the step curve is exact between them; s_max is twice the larger s of
    lambda-hat and a feasible lambda*, capped at calibration.lambda_search_max (an uncertified LTT sits at the cap).
    Checks: the pick against the exact path at its breakpoints, and each audited Best-of-N output's mean cost
    against the pick at its lambda (equal when the audit's cost scorers are the candidates')."""
    from lara.calibrate.vector import ray_path

    names = list(record["names"])
    tau = np.asarray(record["tau"], dtype=float)
    n = int(record["decoder"]["n"])
    d = np.asarray(record["direction"], dtype=float)
    deployed = (record.get("guarantee") or {}).get("procedure")
    marks = {}
    for key, field in (("hat", "lambda_hat"), ("star", "lambda_star")):
        if record.get(field) is not None:
            s, on = _along(record[field], d)
            marks[key] = {"lambda": np.asarray(record[field], dtype=float), "s": s, "on_ray": on}
    audited = []
    for out in audit["outputs"]:
        s, on = _along(out["lambda"], d)
        rows = out["rows"]
        audited.append({"method": out["method"], "setting": out["setting"], "lambda": np.asarray(out["lambda"]),
                        "s": s, "on_ray": on, "cost": np.array([r["mean_cost"] for r in rows]),
                        "ci95": np.array([r["ci95"] for r in rows], dtype=float),
                        "verdicts": [r["verdict"] for r in rows], "reward": float(rows[0]["mean_reward"]),
                        "reward_ci95": [float(x) for x in rows[0]["reward_ci95"]],
                        "joint": audit["joint"].get((out["method"], out["setting"])) or {}})
    cap = _search_max(record, [p["lambda"] for p in (record.get("procedures") or {}).values()
                               if p.get("lambda") is not None]) / float(d.max())
    feasible_star = bool(((record.get("procedures") or {}).get(deployed) or {}).get("feasible", True))
    wanted = [marks[k]["s"] for k in marks if k == "hat" or feasible_star]
    s_top = min(cap, max(0.05, 2.0 * max(wanted))) if wanted else cap
    path = ray_path(scores.reward, scores.costs, scores.mask, d, n, s_top)
    on_ray = [p["s"] for p in (*marks.values(), *audited) if p["on_ray"] and p["s"] <= s_top]
    s = np.union1d(np.union1d(np.linspace(0.0, s_top, RAY_POINTS), path.s), on_ray)
    reward, costs = held_out(scores, s[:, None] * d[None, :])
    exact_gap = float(np.abs(costs[np.searchsorted(s, path.s)] - path.mean).max())
    for p in marks.values():
        r, c = held_out(scores, p["lambda"])
        p |= {"reward": float(r[0]), "cost": c[0], "meets_tau": bool(meets(c[0], tau))}
    gaps = [float(np.abs(a["cost"] - held_out(scores, a["lambda"])[1][0]).max())
            for a in audited if a["method"] == "bon"]
    checks = {"pick_vs_exact_path": exact_gap, "bon_audit_vs_pick": max(gaps) if gaps else None}
    if exact_gap > 1e-9:
        log.warning("the decoder's pick differs from the exact expected Best-of-%d path by %.3g (ties?)", n, exact_gap)
    return SweepView(names, tau, n, scores.n_prompts, d, deployed,
                     {"s": s, "reward": reward, "costs": costs, "s_max": s_top, "breakpoints": len(path.s) - 1},
                     marks, audited, checks)


def _named(names, v) -> str:
    return "(" + ", ".join(f"{name} {x:.3g}" for name, x in zip(names, np.atleast_1d(v), strict=True)) + ")"


def _short(verdict: str | None) -> str:
    return str(verdict).split(" (", 1)[0] if verdict else "not audited"


def _sweep_handles(view: SweepView, colour: dict, lines: dict) -> list:
    """The legend of :func:`constraints_sweep`: the curve, tau, lambda-hat and lambda*, every audited output."""
    from matplotlib.lines import Line2D

    m, s_top = len(view.names), view.curve["s_max"]
    handles = [Line2D([], [], color="0.3", lw=1.6, label=f"Best-of-{view.n} on the test candidates: the pick at "
                                                         "each s (exact)"),
               Line2D([], [], color="black", ls="--", lw=1.0, label="$\\tau$")]
    for key, title in (("hat", "$\\hat\\lambda$"), ("star", "$\\lambda^*$")):
        if key in view.marks:
            p = view.marks[key]
            extra = f", {view.deployed}: deployed" if key == "star" and view.deployed else ""
            where = "off the ray, " if not p["on_ray"] else ""
            at = f"{where}s = {p['s']:.3g}{extra}" if m > 1 else extra[2:]
            value = _vec(p["lambda"]) if m > 1 else f"{p['lambda'][0]:.3g}"
            handles.append(Line2D([], [], **lines[key], label=f"{title} = {value}" + (f" ({at})" if at else "")))
    for a in view.audited:
        where = "" if a["on_ray"] else ", off the ray"
        where += f", s = {a['s']:.3g} beyond the plot" if a["s"] > s_top * (1 + 1e-9) else ""
        handles.append(Line2D([], [], color=colour[a["method"]], marker=SWEEP_MARKERS.get(a["setting"], "o"), ls="",
                              label=f"{METHOD_NAMES.get(a['method'], a['method'])} {a['setting']}: $\\lambda$ = "
                                    f"{_vec(a['lambda'])}{where}; joint {_short(a['joint'].get('verdict'))}"))
    handles += [Line2D([], [], color="0.3", marker="o", ls="", label="audited: meets $\\tau$ (one-sided 95%; "
                                                                     "reward panel: every $\\tau$ at once)"),
                Line2D([], [], color="0.3", marker="o", ls="", mfc="white", label="audited: not shown to meet")]
    return handles


def constraints_sweep(view: SweepView, opts: FigureSettings):
    """Fig. 1 per constraint for the vector lambda, on the held-out test prompts: one panel per constraint of the
    Best-of-N decoder's mean cost along the ray lambda = s d (the candidate it picks at each s, exact between the
    drawn points), its tau dashed, and one of its mean reward; lambda-hat and the deployed lambda* as vertical
    lines; every audited output (Best-of-N and ARGS at each setting) at the s of its lambda with its bootstrap
    95 % interval, filled where the audit's verdict is met (the reward panel: the joint verdict), marked off the
    ray where its lambda is not s d."""
    import textwrap

    import matplotlib.pyplot as plt
    from matplotlib.transforms import ScaledTranslation

    pal = _style(opts)
    m = len(view.names)
    c = view.curve
    s, s_top = c["s"], c["s_max"]
    methods = list(dict.fromkeys(a["method"] for a in view.audited))
    colour = {meth: pal[(m + 1 + i) % len(pal)] for i, meth in enumerate(methods)}
    fig, axes = plt.subplots(1, m + 1, figsize=(max(opts.width, 2.8 * (m + 1)), opts.height + 1.8), sharex=True,
                             layout="constrained")
    # methods side by side at one s (a few points apart on the page; the data positions stay exact)
    shift = {meth: ScaledTranslation((i - (len(methods) - 1) / 2) * 4 / 72, 0, fig.dpi_scale_trans)
             for i, meth in enumerate(methods)}
    panels = [(axes[j], c["costs"][:, j], f"{name}: $\\tau$ = {tau:g}", "held-out mean cost", name)
              for j, (name, tau) in enumerate(zip(view.names, view.tau, strict=True))]
    panels.append((axes[m], c["reward"], "reward", "held-out mean reward", "reward"))
    lines = {"hat": {"color": "grey", "lw": 1.2, "ls": "-"}, "star": {"color": "black", "lw": 1.5, "ls": "-."}}
    # the direction in every panel's label, wrapped to the panel's width (about half a font size per character)
    room = int(0.8 * fig.get_figwidth() / (m + 1) * 72 / (0.5 * plt.rcParams["font.size"]))
    xlabel = "$\\lambda$" if m == 1 else textwrap.fill(
        f"s ($\\lambda$ = s d), d = {_named(view.names, view.direction)}", max(room, 16))
    for j, (ax, y, title, ylabel, gid) in enumerate(panels):
        ax.plot(s, y, drawstyle="steps-post", color=pal[j] if j < m else "0.3", lw=1.6, zorder=3, gid=f"curve:{gid}")
        if j < m:
            ax.axhline(view.tau[j], color="black", ls="--", lw=1.0)
        for key, style in lines.items():
            if key in view.marks:
                ax.axvline(min(view.marks[key]["s"], s_top), zorder=2, **style)
        span = [float(np.min(y)), float(np.max(y)), *([view.tau[j]] if j < m else [])]
        for a in view.audited:
            if j < m:
                y0, (lo, hi), met = a["cost"][j], a["ci95"][j], a["verdicts"][j] == VERDICTS[0]
            else:
                y0, (lo, hi), met = a["reward"], a["reward_ci95"], a["joint"].get("verdict") == VERDICTS[0]
            beyond = a["s"] > s_top * (1 + 1e-9)
            x = min(a["s"], s_top)
            col = colour[a["method"]]
            ax.errorbar(x, y0, yerr=[[y0 - lo], [hi - y0]], fmt=SWEEP_MARKERS.get(a["setting"], "o"), color=col,
                        ms=9 if a["setting"] == "star" else 6, capsize=2, lw=0.8, mew=1.4, zorder=5, clip_on=False,
                        mfc=col if met else "white", transform=ax.transData + shift[a["method"]],
                        gid=f"audit:{a['method']}/{a['setting']}")
            if beyond or not a["on_ray"]:
                note = ("off the ray" if not a["on_ray"] else "") + (f" s = {a['s']:.3g} →" if beyond else "")
                ax.annotate(note.strip(), (x, y0), textcoords="offset points", xytext=(-4, 6), ha="right",
                            fontsize="x-small", color=col)
            span += [lo, hi]
        # the range by hand: the shifted error bars are not in data coordinates, so autoscaling leaves them out
        pad = 0.06 * (max(span) - min(span) or 1.0)
        ax.set_ylim(min(span) - pad, max(span) + pad)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.set_xlim(0.0, s_top)
        ax.set_xlabel(xlabel)
    handles = _sweep_handles(view, colour, lines)
    along = "against $\\lambda$" if m == 1 else "along the ray"
    fig.suptitle(f"Best-of-{view.n} {along}, held out ({view.n_prompts} test prompts; audit: bootstrap 95%)")
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False, fontsize="small")
    return fig


def sweep_shows(view: SweepView, audit: dict) -> dict:
    """What the constraints_sweep figure shows, for its provenance sidecar and report caption."""
    def r4(v):
        return [round(float(x), 4) for x in np.atleast_1d(v)]

    marks = {k: {"lambda": r4(p["lambda"]), "s": round(p["s"], 4), "on_ray": p["on_ray"], "cost": r4(p["cost"]),
                 "reward": round(p["reward"], 4), "meets_tau": p["meets_tau"]} for k, p in view.marks.items()}
    audited = [{"method": a["method"], "setting": a["setting"], "lambda": r4(a["lambda"]), "s": round(a["s"], 4),
                "on_ray": a["on_ray"], "cost": r4(a["cost"]), "ci95": [r4(ci) for ci in a["ci95"]],
                "verdicts": [_short(v) for v in a["verdicts"]], "reward": round(a["reward"], 4),
                "joint": _short(a["joint"].get("verdict"))} for a in view.audited]
    return {"constraints": [{"name": n, "tau": float(t)} for n, t in zip(view.names, view.tau, strict=True)],
            "n": view.n, "test_prompts": view.n_prompts, "direction": r4(view.direction),
            "deployed": view.deployed, "marks": marks, "audited": audited,
            "ray": {"s_max": round(float(view.curve["s_max"]), 4), "points": len(view.curve["s"]),
                    "breakpoints": int(view.curve["breakpoints"])},
            "checks": view.checks, "audit": {"procedure": audit.get("procedure"),
                                             "lambda_record": audit.get("lambda_record")}}


def _records(trail: list[dict]) -> dict[str, dict]:
    """The steps' own records (parquet metadata, model provenance) along a trail, by path."""
    return {e["path"]: e["lara"] for e in trail if isinstance(e.get("lara"), dict)}


def _sampled_and_scored(records: dict[str, dict], scores_suffix: str) -> dict:
    """Policy, N and scorers behind a scored sample table (``{pool}/scores.parquet``)."""
    scored = next((rec for path, rec in records.items() if path.endswith(scores_suffix)), {})
    sampled = records.get(scored.get("input"), {})
    return {"policy": sampled.get("model", "unknown"), "n": sampled.get("n"),
            "reward_model": scored.get("reward", "unknown"), "cost_model": scored.get("cost", "unknown")}


def describe(kind: str, trail: list[dict], lam: dict | None = None, summary: pd.DataFrame | None = None) -> dict:
    """What a figure shows, read from its inputs and the records of the jobs that made them (never
    from the configuration): the policy and scorers behind the data, N, tau, lambda-hat, lambda*."""
    records = _records(trail)
    shows: dict = {"kind": kind}
    if lam is not None:
        shows |= {"tau": lam["tau"], "lambda_hat": round(lam["lambda_hat"], 4),
                  "lambda_star": round(lam["lambda_star"], 4), "calibration_mode": lam.get("mode"),
                  "beta": lam.get("beta"), "calibration_prompts": lam.get("n_prompts"),
                  "bootstrap_replicates": lam.get("bootstrap", {}).get("replicates"),
                  "quantile": lam.get("bootstrap", {}).get("quantile")}
        shows["calibrated_on"] = _sampled_and_scored(records, "/calibration/scores.parquet")
    if kind == "lambda_sweep":
        shows["best_of_n"] = _sampled_and_scored(records, "/bon/scores.parquet")
    if kind in ("constraints", "constraints_sweep"):
        pool = "calibration_scores.parquet" if kind == "constraints" else "bon_scores.parquet"
        scored = next((rec for path, rec in records.items() if path.endswith(pool)), {})
        sampled = records.get(scored.get("input"), {})
        shows["constraint_scores"] = {"policy": sampled.get("model", "unknown"), "n": sampled.get("n"),
                                      "reward_model": scored.get("reward", "unknown"),
                                      "cost_models": scored.get("costs") or {}}
    if summary is not None:
        shows["rows"] = [f"{m}/{s}" for m, s in zip(summary["method"], summary["setting"], strict=True)]
        scorers = {(rec.get("reward"), rec.get("cost")) for path, rec in records.items()
                   if "/eval/" in path and path.endswith("/scores.parquet")}
        shows["evaluation"] = [{"reward_model": r, "cost_model": c} for r, c in sorted(scorers, key=str)]
        judges = {rec.get("judge") for path, rec in records.items() if path.endswith("/judge.parquet")}
        shows["judge"] = sorted(str(j) for j in judges if j) or None
    return shows


def summary_line(shows: dict) -> str:
    """One sentence of what a figure shows, for its PNG/PDF metadata."""
    parts = [f"{shows['kind']}"]
    for key in ("best_of_n", "calibrated_on"):
        if key in shows:
            d = shows[key]
            parts.append(f"{key.replace('_', ' ')}: policy {d['policy']} (N = {d['n']}), "
                         f"scorers {d['reward_model']} / {d['cost_model']}")
    if "constraints" in shows and shows["kind"] == "constraints_sweep":
        cons = ", ".join(f"{c['name']} (tau = {c['tau']:g})" for c in shows["constraints"])
        marks = ", ".join(f"{k} {p['lambda']} (s = {p['s']}): held-out cost {p['cost']}"
                          for k, p in shows["marks"].items())
        audited = ", ".join(f"{a['method']}/{a['setting']} joint {a['joint']}" for a in shows["audited"])
        parts.append(f"Best-of-{shows['n']} along the ray d = {shows['direction']} for {cons} on "
                     f"{shows['test_prompts']} test prompts: {marks}; audited {audited}; deployed {shows['deployed']}")
        d = shows.get("constraint_scores")
        if d:
            costs = ", ".join(f"{k} {v}" for k, v in d["cost_models"].items())
            parts.append(f"candidates: policy {d['policy']} (N = {d['n']}), reward {d['reward_model']}, costs {costs}")
    elif "constraints" in shows:
        cons = ", ".join(f"{c['name']} (tau = {c['tau']:g})" for c in shows["constraints"])
        procs = ", ".join(f"{k} {p['lambda']}" for k, p in shows["procedures"].items())
        parts.append(f"Best-of-{shows['n']} with a vector lambda for {cons} on {shows['calibration_prompts']} "
                     f"calibration prompts ({shows['view']}): {procs}; deployed {shows['deployed']}")
        d = shows.get("constraint_scores")
        if d:
            costs = ", ".join(f"{k} {v}" for k, v in d["cost_models"].items())
            parts.append(f"scored: policy {d['policy']} (K = {d['n']}), reward {d['reward_model']}, costs {costs}")
    if "scenarios" in shows:
        parts.append(f"after deployment (tau = {shows['tau']:g}): scenarios {', '.join(shows['scenarios'])}; "
                     f"arms {', '.join(shows['arms'])}")
    if "lambda_hat" in shows:
        parts.append(f"tau = {shows['tau']:g}, lambda-hat = {shows['lambda_hat']}, lambda* = {shows['lambda_star']}"
                     f" ({shows['calibration_mode']} calibration)")
    for ev in shows.get("evaluation", []):
        parts.append(f"evaluated by {ev['reward_model']} / {ev['cost_model']}")
    return "; ".join(parts)


def read_audit(path: str, lambda_json: str | None = None) -> dict:
    """constraint_audit.json with at least one decoder row, every number in them finite, made with ``lambda_json``
    (lara.identity.audit_disagreements)."""
    import json
    import math

    from lara.calibrate.record import read_lambda
    from lara.read.files import DataError
    from lara.identity import audit_disagreements

    try:
        audit = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable constraint audit ({exc})") from None
    problems = audit_disagreements(audit, read_lambda(lambda_json)) if lambda_json else []
    if problems:
        raise DataError(f"--audit {path}: does not belong to --lambda-json {lambda_json}: {'; '.join(problems)}")
    rows = [r for r in audit.get("decoders") or [] if r.get("setting") != "policy"]
    if not rows:
        raise DataError(f"{path}: no decoder scored by the decoding models (decoders); nothing to draw")
    for r in rows:
        values = [r.get("lambda"), r.get("mean_cost"), r.get("mean_reward"), *r.get("ci95", []),
                  *r.get("reward_ci95", [])]
        if len(values) != 7 or not all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            raise DataError(f"{path}: decoder row {r.get('method')}/{r.get('setting')} lacks a finite lambda, "
                            "mean or interval")
    return audit


def read_coverage(path: str) -> dict:
    """coverage.json (lara coverage) with a summary whose numbers are finite."""
    import json
    import math

    from lara.read.files import DataError

    try:
        cov = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a readable coverage study ({exc})") from None
    keys = ("n", "k", "repeats", "violation_rate", "violation_lo", "violation_hi", "reward_given_up")
    rows = cov.get("summary") if isinstance(cov, dict) else None
    if not rows or not all(isinstance(r.get(k), int | float) and math.isfinite(r[k]) for r in rows for k in keys):
        raise DataError(f"{path}: no coverage summary with finite {', '.join(keys)}; rerun `lara coverage`")
    return cov


OUTPUTS = ("png", "pdf", "provenance")  # the files this step writes (checked first: lara.cli.check_outputs)


def add_arguments(parser) -> None:
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--sweep", default=None, help="Best-of-N sweep.csv (lambda_sweep)")
    parser.add_argument("--lambda-json", default=None,
                        help="lambda.json (lambda_sweep, calibration; tradeoff: optional; constraints, "
                        "constraints_sweep: the vector record, constraints/lambda.json)")
    parser.add_argument("--summary", default=None, help="eval summary.csv (tradeoff)")
    parser.add_argument("--audit", default=None, help="eval constraint_audit.json (decoders, taus); the constraints "
                        "stage's constraints/audit.json (constraints_sweep)")
    parser.add_argument("--coverage", default=None, help="calibration coverage.json (coverage)")
    parser.add_argument("--report", default=None, help="deployment report.csv (deployment)")
    parser.add_argument("--traces", nargs="+", default=None,
                        help="deployment {scenario}/trace.parquet files, one per scenario (deployment)")
    parser.add_argument("--scores", default=None,
                        help="the constraints' calibration scores (constraints/calibration_scores.parquet: reward, "
                        "cost_<name>) the vector --lambda-json was calibrated on (constraints); the test prompts' "
                        "scored Best-of-N candidates, constraints/bon_scores.parquet (constraints_sweep)")
    parser.add_argument("--constraints", default=None,
                        help="JSON list of the constraints (calibration.constraints) (constraints, "
                        "constraints_sweep)")
    add_settings_arguments(parser, FigureSettings)
    parser.add_argument("--rule", default="figure", help="the rule name recorded in the provenance sidecar")
    parser.add_argument("--experiment-settings", default=None,
                        help="the experiment's settings table (results/{exp}/settings.tsv): recorded, hashed, in the "
                        "figure's provenance")
    parser.add_argument("--png", required=True)
    parser.add_argument("--pdf", required=True)
    parser.add_argument("--provenance", required=True, help="the sidecar .provenance.json")


def vector_figure(args, opts: FigureSettings):
    """The constraints figures (kinds constraints, constraints_sweep): the figure and what it shows."""
    if args.kind == "constraints":
        record, scores = read_vector_inputs(args.lambda_json, args.scores, args.constraints)
        view = constraint_view(record, scores)
        return constraints(view, record, opts), constraint_shows(view)
    record, scores = read_sweep_inputs(args.lambda_json, args.scores, args.constraints)
    audit = read_sweep_audit(args.audit, args.lambda_json, record, scores.prompts)
    view = sweep_view(record, scores, audit)
    return constraints_sweep(view, opts), sweep_shows(view, audit)


def run(args) -> None:
    import matplotlib.pyplot as plt

    from lara.calibrate.record import read_lambda
    from lara.read.files import DataError, read_table, require_finite, require_rows
    from lara.identity import check_sweep
    from lara.io import atomic_output
    from lara.trail import build_trail, write_sidecar

    opts = read_settings(args, FigureSettings)
    need = {"lambda_sweep": ("sweep", "lambda_json"), "tradeoff": ("summary",), "calibration": ("lambda_json",),
            "decoders": ("audit", "lambda_json"), "taus": ("audit", "lambda_json"), "coverage": ("coverage",),
            "deployment": ("report", "traces"), "constraints": ("lambda_json", "scores", "constraints"),
            "constraints_sweep": ("lambda_json", "scores", "audit", "constraints")}
    missing = [f"--{n.replace('_', '-')}" for n in need[args.kind] if getattr(args, n) is None]
    if missing:
        raise DataError(f"figure {args.kind} needs {', '.join(missing)}")
    inputs = [getattr(args, n) for n in ("sweep", "summary", "audit", "coverage", "report", "scores", "lambda_json",
                                         "experiment_settings") if getattr(args, n) is not None] + (args.traces or [])
    # the constraints figures' record is a vector lambda (read_vector_inputs), not a scalar lambda.json
    vector = args.kind in ("constraints", "constraints_sweep")
    lam = read_lambda(args.lambda_json).data if args.lambda_json and not vector else None
    summary, sizes, extra = None, None, {}
    if args.kind == "lambda_sweep":
        sweep = require_finite(require_rows(read_table(args.sweep, required=(
            "n", "lambda", "label", "mean_reward", "mean_cost")), args.sweep), ("lambda", "mean_reward", "mean_cost"),
            args.sweep)
        check_sweep(sweep, read_lambda(args.lambda_json), f"--sweep {args.sweep}")
        sizes = sorted(int(n) for n in sweep["n"].unique())
        fig = lambda_sweep(sweep, lam, opts)
    elif args.kind == "tradeoff":
        summary = require_finite(require_rows(read_table(args.summary, required=(
            "method", "setting", "helpfulness", "harmfulness")), args.summary), ("helpfulness", "harmfulness"),
            args.summary)
        fig = tradeoff(summary, opts)
    elif args.kind == "decoders":
        fig = decoders(read_audit(args.audit, args.lambda_json), lam, opts)
    elif args.kind == "taus":
        audit = read_audit(args.audit, args.lambda_json)
        if len(audit.get("taus") or []) < 2:
            raise DataError(f"{args.audit}: the audit lists fewer than two taus (taus); list several in "
                            "calibration.tau to draw lambda* against tau")
        fig = taus(audit, opts)
    elif args.kind == "coverage":
        fig = coverage(read_coverage(args.coverage), opts)
    elif args.kind == "deployment":
        from lara.evaluate import deployment_report as dr

        report = dr.read_report(args.report, read_lambda(args.lambda_json) if args.lambda_json else None)
        fig = deployment(report, dr.read_traces(args.traces, report, args.report), opts)
        extra = dr.shows(report)
    elif vector:
        fig, extra = vector_figure(args, opts)
    else:
        fig = calibration(lam, opts)
    figure_dir = Path(args.png)
    trail = build_trail(inputs, made_under=None if figure_dir.is_absolute() else figure_dir.parts[0])
    shows = describe(args.kind, trail, lam, summary) | extra
    if sizes:
        shows["sizes"] = sizes
    if args.experiment_settings:
        shows["settings_table"] = args.experiment_settings
    line = summary_line(shows)
    for path, fmt in ((args.png, "png"), (args.pdf, "pdf")):
        meta = {"Creator": "lara", "Description": line} if fmt == "png" else \
            {"Creator": "lara", "Subject": line, "CreationDate": None}
        with atomic_output(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=opts.dpi, bbox_inches="tight", metadata=meta)
    plt.close(fig)
    write_sidecar([args.png, args.pdf], inputs, args.rule, {"kind": args.kind, "options": opts.section()},
                  args.provenance,
                  trail=trail, shows=shows)
    log.info("%s", line)
    log.info("wrote %s, %s and %s", args.png, args.pdf, args.provenance)
