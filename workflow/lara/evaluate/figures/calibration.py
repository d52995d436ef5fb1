"""``lara figure --kind calibration``: the empirical dual g(lambda), the calibrated decoder's expected cost
(tau - g'(lambda)) and the bootstrap histogram of lambda-hat, all read off lambda.json."""

from __future__ import annotations

import numpy as np

from lara.evaluate.figures.common import Drawn, FigureSettings, panels


def calibration(lam: dict, opts: FigureSettings):
    """The calibration at a glance: the calibrated decoder's expected cost on the calibration prompts
    against lambda (Best-of-N for the calibrated N in bon mode, the Gibbs tilt in soft mode: tau - g'),
    the empirical dual, and the bootstrap of lambda-hat. The lambda axes are symlog (linear below
    Lambda/1000, logarithmic above), so lambda-hat and lambda* are apart even when they are small."""
    c = lam["curves"]
    lams, tau = np.asarray(c["lambda"]), lam["tau"]
    pal, fig, axes = panels(opts, 1, 3, figsize=(opts.width * 1.3, opts.height), layout=None)
    decoder = lam.get("decoder") or {}
    if decoder.get("kind") == "best_of_n":
        what = f"Best-of-{decoder.get('n') or 'K'}"
    else:
        what = f"Gibbs tilt (beta = {lam.get('beta', 1):g})"
    axes[0].plot(lams, tau - np.asarray(c["g_prime"]), color=pal[1])
    axes[0].axhline(tau, color="black", ls="--", lw=1, label="$\\tau$")
    axes[0].set(ylabel="expected cost (calibration)", title=f"{what}: $E_{{\\pi_\\lambda}}[c]$")
    axes[1].plot(lams, c["g"], color=pal[0])
    axes[1].set(ylabel="$\\hat g(\\lambda)$", title="empirical dual" + (" (N = K)" if lam.get("mode") == "bon" else ""))
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
    axes[2].set(xlabel="bootstrap $\\hat\\lambda$", ylabel="replicates",
                title=f"bootstrap ({lam['bootstrap']['replicates']} replicates)")
    handles, labels = axes[2].get_legend_handles_labels()
    handles.insert(0, axes[0].get_legend_handles_labels()[0][0])
    labels.insert(0, "$\\tau$")
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def figure(args, opts: FigureSettings, lam: dict) -> Drawn:
    """--lambda-json (read by the command) drawn: a record of lara calibrate (its dual's curves)."""
    from lara.read.files import DataError

    kind = (lam.get("decoder") or {}).get("kind")
    if kind not in ("best_of_n", "gibbs_tilt") or "g_prime" not in (lam.get("curves") or {}):
        raise DataError(f"--lambda-json {args.lambda_json}: a record of the decoder {kind!r} without the dual's "
                        "curves; this figure draws lara calibrate's record (full Best-of-N or the Gibbs tilt)")
    return Drawn(calibration(lam, opts))
