"""``lara figure --kind taus``: lambda*(tau) for every listed calibration.tau, and Best-of-N at each lambda* on
the held-out test prompts against tau."""

from __future__ import annotations

import numpy as np

from lara.evaluate.figures.common import Drawn, FigureSettings, key, panels


def taus(audit: dict, opts: FigureSettings):
    """lambda*(tau) for every listed calibration.tau (left), and Best-of-N at each lambda* on the held-out
    test prompts (right): mean decoder cost with its bootstrap 95 % interval against tau (the diagonal is
    cost = tau) and mean decoder reward on a twin axis; filled where the audit's verdict is met."""
    from lara.stats import VERDICTS

    pal, fig, axes = panels(opts, 1, 2, height=0.6)
    rows = sorted(audit["taus"], key=lambda r: r["tau"])
    t = np.array([r["tau"] for r in rows])
    axes[0].plot(t, [r["lambda_star"] for r in rows], "-o", color=pal[0], label="$\\lambda^*$")
    axes[0].plot(t, [r["lambda_hat"] for r in rows], "--v", color=pal[1], label="$\\hat\\lambda$")
    for r in rows:
        if r["main"]:
            axes[0].annotate("main $\\tau$", (r["tau"], r["lambda_star"]), textcoords="offset points",
                             xytext=(4, 6), fontsize="small")
    axes[0].set(xlabel="$\\tau$", ylabel="$\\lambda$", title="calibrated $\\lambda$")
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
    handles = [key(color=pal[2], marker="o", ls="", label="cost (meets $\\tau$, one-sided 95%)"),
               key(color=pal[2], marker="o", mfc="white", ls="", label="cost (not shown to meet)"),
               key(color=pal[3], marker="s", ls="", label="reward"),
               key(color="black", ls="--", label="cost = $\\tau$")]
    fig.legend(handles=handles, loc="outside lower center", ncol=4, frameon=False)
    return fig


def figure(args, opts: FigureSettings, lam: dict) -> Drawn:
    """--audit (constraint_audit.json, made with --lambda-json), which must list at least two taus, drawn."""
    from lara.evaluate.figures.decoders import read_audit
    from lara.read.files import DataError

    audit = read_audit(args.audit, args.lambda_json)
    if len(audit.get("taus") or []) < 2:
        raise DataError(f"{args.audit}: the audit lists fewer than two taus (taus); list several in "
                        "calibration.tau to draw lambda* against tau")
    return Drawn(taus(audit, opts))
