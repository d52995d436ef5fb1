"""``lara figure --kind decoders``: every decoder's held-out mean reward and cost by the decoding models (tau's
units) against lambda, at each decoded lambda setting, with tau and the audit's verdicts."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lara.evaluate.figures.common import MARKERS, Drawn, FigureSettings, key, panels


def decoders(audit: dict, lam: dict, opts: FigureSettings):
    """Every decoder held to tau: its held-out mean reward and cost by the decoding models (tau's
    units) at each decoded lambda setting, with bootstrap 95 % intervals over the test prompts; a
    filled marker where the audit's verdict is met (one-sided 95 %), hollow where it is not."""
    from lara.stats import VERDICTS

    pal, fig, axes = panels(opts, 1, 2, height=0.6, sharex=True)
    rows = pd.DataFrame(audit["decoders"])
    rows = rows[rows["setting"] != "policy"]
    if "tau" in rows.columns:  # the main tau's settings; another listed tau's lambda* is in the taus figure
        rows = rows[rows["tau"] == lam["tau"]]
    methods = list(dict.fromkeys(rows["method"]))
    colour = {m: pal[i % len(pal)] for i, m in enumerate(methods)}
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
        ax.set(ylabel=label, xlabel="$\\lambda$ (symlog)")
        positive = np.sort(rows.loc[rows["lambda"] > 0, "lambda"].unique())
        if len(positive):
            linthresh = positive[0] / 2
            ax.set_xscale("symlog", linthresh=linthresh, linscale=0.5)
            decades = range(int(np.ceil(np.log10(linthresh))), int(np.floor(np.log10(positive[-1]))) + 1)
            ax.set_xticks([0.0, *(10.0 ** k for k in decades)])  # 0, then the decades above the linear part
    axes[1].axhline(lam["tau"], color="black", ls="--", lw=1.2)
    axes[0].set_title("helpfulness (test prompts)")
    axes[1].set_title("harmfulness, $\\tau$ dashed")
    handles = [key(color=colour[m], marker="o", ls="-", label=m) for m in methods]
    handles += [key(color="0.3", marker=MARKERS[s], ls="", label=f"$\\lambda$ {s}") for s in MARKERS
                if s in set(rows["setting"])]
    handles += [key(color="0.3", marker="o", ls="", label="meets $\\tau$ (one-sided 95%)"),
                key(color="0.3", marker="o", ls="", mfc="white", label="not shown to meet $\\tau$"),
                key(color="black", ls="--", label=f"$\\tau$ = {lam['tau']:g}")]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), frameon=False)
    return fig


def read_audit(path: str, lambda_json: str | None = None) -> dict:
    """constraint_audit.json with at least one decoder row, every number in them finite, made with ``lambda_json``
    (lara.identity.audit_disagreements)."""
    import math

    from lara.calibrate.record import read_lambda
    from lara.identity import audit_disagreements
    from lara.read.files import DataError, json_file

    audit = json_file(path)
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


def figure(args, opts: FigureSettings, lam: dict) -> Drawn:
    """--audit (constraint_audit.json, made with --lambda-json: :func:`read_audit`) drawn."""
    return Drawn(decoders(read_audit(args.audit, args.lambda_json), lam, opts))
