"""``lara figure --kind lambda_sweep`` (Fig. 1): mean reward and mean cost of Best-of-N against lambda, tau as a
dashed line, lambda-hat and lambda* marked with the bootstrap interval."""

from __future__ import annotations

import numpy as np
import pandas as pd

from lara.evaluate.figures.common import Drawn, FigureSettings, panels
from lara.stats import VERDICTS


def draw_pruned(axes, prune: pd.DataFrame, colour) -> None:
    """Pruned Best-of-N's curve on both panels (dashed, its own lambda-hat and lambda* and certified lambdas marked),
    labelled with its tokens against full Best-of-N's at its lambda*."""
    g = prune[prune["label"] == "grid"].sort_values("lambda")
    star = prune[prune["label"] == "lambda_star"]
    ratio = f", {float(star['token_ratio'].iloc[0]):.1f}x fewer tokens at its $\\lambda^*$" if len(star) else ""
    n = int(prune["n"].iloc[0])
    for ax, col in ((axes[0], "mean_reward"), (axes[1], "mean_cost")):
        ax.plot(g["lambda"], g[col], ls="--", marker=".", ms=4, lw=1.4, color=colour,
                label=f"pruned Best-of-{n}{ratio}")
        ax.fill_between(g["lambda"], g[f"{col}_lo"], g[f"{col}_hi"], color=colour, alpha=0.08, lw=0)
        marks = {"lambda_hat": ("o", "its $\\hat\\lambda$"), "lambda_star": ("*", "its $\\lambda^*$"),
                 "ltt": ("s", "its LTT $\\lambda$"), "ltt_wsr": ("^", "its LTT (betting) $\\lambda$")}
        for label, (marker, title) in marks.items():
            r = prune[prune["label"] == label]
            if len(r):
                ax.plot(r["lambda"], r[col], marker=marker, ms=9, ls="none", mfc="white", mew=1.6, color=colour,
                        label=f"pruned: {title} = {float(r['lambda'].iloc[0]):.3g}")


CORE = "Best-of-k through the calibration core: each procedure's $\\lambda$ (grid)"


def lambda_sweep(sweep: pd.DataFrame, lam: dict, opts: FigureSettings, prune: pd.DataFrame | None = None):
    """Fig. 1: Best-of-N mean reward and cost on the test prompts against lambda, one curve (with its
    bootstrap 95 % band) per N; tau, the decoder's lambda-hat (with its bootstrap band) and lambda*,
    each other N's lambda* as a marker, and shading where the audit says the decoder's N meets tau."""
    pal, fig, axes = panels(opts, 1, 2, height=1.2, sharex=True)
    if "n" not in sweep.columns:
        sweep = sweep.assign(n=0)
    main_n = (lam.get("decoder") or {}).get("n") or int(sweep["n"].max())
    sizes = sorted(sweep["n"].unique())
    colour = {n: pal[i % len(pal)] for i, n in enumerate(sizes)}
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
            core = sweep[(sweep["n"] == n) & sweep["label"].str.startswith("core:")]  # (unlabelled when empty)
            ax.plot(core["lambda"], core[col], marker="x", ms=6, ls="none", color=colour[n],
                    label=CORE if len(core) else None)
        soft = sweep[(sweep["n"] == main_n) & sweep["label"].str.startswith("soft_beta=")]
        for i, r in enumerate(soft.sort_values("lambda").to_dict("records")):
            ax.plot(r["lambda"], r[col], marker="X", ms=8, ls="none", color=str(0.15 + 0.25 * (i % 3)),
                    label=f"soft mode $\\beta$ = {r['label'].split('=', 1)[1]}: $\\lambda^*$ = {r['lambda']:.3g}")
        certified = {"crc": ("D", "CRC"), "ltt": ("s", "LTT"), "ltt_wsr": ("^", "LTT (betting)")}
        for i, (name, (marker, title)) in enumerate(certified.items()):
            r = sweep[(sweep["n"] == main_n) & (sweep["label"] == name)]
            if len(r):
                delta = ((lam.get("procedures") or {}).get(name) or {}).get("delta")
                extra = f" ($\\delta$ = {delta:g})" if delta is not None else ""
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
        ax.set(xlabel="$\\lambda$", ylabel=label)
        positive = np.sort(sweep.loc[sweep["lambda"] > 0, "lambda"].unique())
        if len(positive) and positive[-1] / positive[0] > 20:  # a small lambda* next to a wide grid
            ax.set_xscale("symlog", linthresh=positive[0])
    if prune is not None:
        draw_pruned(axes, prune, pal[len(sizes) % len(pal)])
    tau = lam["tau"]
    axes[1].axhline(tau, color="black", ls="--", lw=1.2, label=f"$\\tau$ = {tau:g}")
    if "verdict" in sweep.columns:
        g = sweep[(sweep["n"] == main_n) & (sweep["label"] == "grid")].sort_values("lambda")
        met = g[g["verdict"] == VERDICTS[0]]  # the sweep's own verdict (lara.stats)
        if len(met):
            axes[1].axvspan(met["lambda"].min(), g["lambda"].max(), color="green", alpha=0.08,
                            label=f"audit: N = {main_n} meets $\\tau$ (95%)")
    axes[0].set_title("helpfulness")
    axes[1].set_title("harmfulness (test prompts)")
    shown = {}  # each label once, with its first handle
    for ax in axes:
        for hd, lb in zip(*ax.get_legend_handles_labels(), strict=True):
            shown.setdefault(lb, hd)
    # below the panels, in exactly the room it needs (constrained layout: never over the axis labels)
    fig.legend(list(shown.values()), list(shown), loc="outside lower center", ncol=3, frameon=False)
    return fig


def figure(args, opts: FigureSettings, lam: dict) -> Drawn:
    """--sweep (sweep.csv of ``lara bon-sweep``, every number finite, made with --lambda-json) drawn; the sizes N
    it holds are part of what the figure shows."""
    from lara import identity
    from lara.calibrate.record import read_lambda
    from lara.read.files import DataError

    kind = (lam.get("decoder") or {}).get("kind")
    if kind != "best_of_n":  # as lara bon-sweep's --lambda-json; a pruned sweep is drawn beside it, with its record
        hint = " (pass a pruned sweep as --prune-sweep, its record as --prune-lambda-json)" \
            if kind == "pruned_best_of_n" else ""
        raise DataError(f"--lambda-json {args.lambda_json}: decoder {kind} ({lam.get('mode')} mode), expected "
                        f"best_of_n: --sweep is full Best-of-N's (lara bon-sweep){hint}")
    sweep = identity.table(args.sweep, "--sweep", ("n", "lambda", "label", "mean_reward", "mean_cost"),
                           ("lambda", "mean_reward", "mean_cost")).df
    identity.check_sweep(sweep, read_lambda(args.lambda_json), f"--sweep {args.sweep}")
    sizes = sorted(int(n) for n in sweep["n"].unique())
    prune = read_prune_sweep(args.prune_sweep, sweep, lam, getattr(args, "prune_lambda_json", None)) \
        if getattr(args, "prune_sweep", None) else None
    extra = ({"sizes": sizes} if sizes else {}) | ({"pruned": True} if prune is not None else {})
    return Drawn(lambda_sweep(sweep, lam, opts, prune), extra)


def read_prune_sweep(path, sweep: pd.DataFrame, lam: dict, record_path) -> pd.DataFrame:
    """The pruned decoder's sweep, checked: made with its record (--prune-lambda-json: the sweep's record digest, its
    N, each calibrated row's lambda), every number finite, tokens and their ratio consistent, its tau the figure's, its
    prompts the Best-of-N sweep's (the same test prompts' candidates)."""
    from lara import identity
    from lara.calibrate.procedures import check_record_values
    from lara.calibrate.pruned import PrunedBestOfN
    from lara.calibrate.record import read_lambda
    from lara.read.files import DataError

    if not record_path:
        raise DataError(f"--prune-sweep {path}: pass the pruned decoder's record it was made with "
                        "(--prune-lambda-json lambda_bon_prune.json)")
    rec = read_lambda(record_path)
    if rec.decoder.get("kind") != "pruned_best_of_n":
        raise DataError(f"--prune-lambda-json {record_path}: not a pruned Best-of-N record (lara calibrate-prune)")
    check_record_values(rec, PrunedBestOfN)
    cols = ("n", "lambda", "label", "mean_reward", "mean_cost", "mean_reward_lo", "mean_reward_hi", "mean_cost_lo",
            "mean_cost_hi", "tokens", "tokens_full", "token_ratio", "tau", "prompt_set", "record")
    prune = identity.table(path, "--prune-sweep", cols, cols[1:2] + cols[3:13]).df
    if set(prune["record"]) != {identity.file_digest(record_path)}:
        raise DataError(f"--prune-sweep {path}: made with another record than --prune-lambda-json {record_path}")
    if set(prune["n"]) != {rec.decoder.get("n")}:
        raise DataError(f"--prune-sweep {path}: Best-of-{sorted(set(prune['n']))} rows, but the record is for "
                        f"N = {rec.decoder.get('n')}")
    want = {"lambda_hat": rec.lambda_hat, "lambda_star": rec.lambda_star}
    for label, value in want.items():
        rows = prune[prune["label"] == label]
        if len(rows) != 1 or not np.isclose(float(rows["lambda"].iloc[0]), value, rtol=1e-9, atol=1e-12):
            raise DataError(f"--prune-sweep {path}: its {label} row is not the record's {label} = {value:g} (one row)")
    ratio = prune["tokens_full"] / prune["tokens"]
    if ((prune["tokens"] > prune["tokens_full"]) | ~np.isclose(prune["token_ratio"], ratio, rtol=1e-6)).any():
        raise DataError(f"--prune-sweep {path}: tokens, tokens_full and token_ratio do not agree (a pruned decoder "
                        "generates at most full Best-of-N's tokens)")
    if (prune["tau"] != lam["tau"]).any():
        raise DataError(f"--prune-sweep {path}: audited against tau = {prune['tau'].iloc[0]:g}, but the figure's "
                        f"lambda.json is for tau = {lam['tau']:g}")
    if "prompt_set" in sweep.columns and set(prune["prompt_set"]) != set(sweep["prompt_set"]):
        raise DataError(f"--prune-sweep {path}: made on other test prompts than --sweep (prompt-set digests "
                        f"{sorted(set(prune['prompt_set']))} and {sorted(set(sweep['prompt_set']))})")
    return prune
