"""``lara figure --kind tradeoff`` (Fig. 2): helpfulness against harmlessness for every method and setting, one
panel for the model evaluation and one for the LLM judge (a note when no judge ran)."""

from __future__ import annotations

import math

import pandas as pd

from lara.evaluate.figures.common import MARKERS, Drawn, FigureSettings, log, theme


def tradeoff(summary: pd.DataFrame, opts: FigureSettings):
    import matplotlib.pyplot as plt

    pal = theme(opts)
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
            xerr = [[max(0.0, x - getattr(r, f"{xcol}_lo"))], [max(0.0, getattr(r, f"{xcol}_hi") - x)]]
            ylo, yhi = getattr(r, f"{ycol}_lo"), getattr(r, f"{ycol}_hi")  # (within the last bit: _read)
            yerr = [[max(0.0, y - (-yhi if negate else ylo))], [max(0.0, (-ylo if negate else yhi) - y)]]
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


def _read(path) -> pd.DataFrame:
    """--summary: one row per method and setting, its lambda a number (or empty: a baseline), each drawn value
    finite and within its own interval."""
    from lara.read.expect import check_nullable_numbers
    from lara.read.files import DataError, read_table, require_finite, require_rows

    where, cols = f"--summary {path}", [f"{c}{e}" for c in ("helpfulness", "harmfulness") for e in ("", "_lo", "_hi")]
    summary = require_finite(require_rows(read_table(path, required=("method", "setting", "lambda", *cols),
                                                     where=where), where), cols, where)
    judged = [c for c in ("judge_helpfulness", "judge_harmlessness") if c in summary]
    read_table(path, required=[f"{c}{e}" for c in judged for e in ("_lo", "_hi")], where=where)  # (a copy)
    check_nullable_numbers(summary, ["lambda", *(f"{c}{e}" for c in judged for e in ("", "_lo", "_hi"))], where,
                           "a number, or empty (a fine-tuned policy's lambda, no judge rating)")
    twice = summary.duplicated(["method", "setting"])
    if twice.any():
        r = summary[twice].iloc[0]
        raise DataError(f"{where}: lists {r['method']}/{r['setting']} twice (one row per method and setting)")
    for c in ("helpfulness", "harmfulness", *judged):
        x, lo, hi = (pd.to_numeric(summary[f"{c}{e}"], errors="coerce") for e in ("", "_lo", "_hi"))
        slack = 1e-9 * (1 + x.abs())  # a constant column's bootstrap mean may differ from its mean in the last bit
        out = x.notna() & ~((lo - slack <= x) & (x <= hi + slack))
        if out.any():
            r = summary[out].iloc[0]
            raise DataError(f"{where}: {r['method']}/{r['setting']}'s {c} {x[out].iloc[0]:g} lies outside "
                            f"its own interval [{lo[out].iloc[0]:g}, {hi[out].iloc[0]:g}] ({c}_lo, {c}_hi)")
    return summary


def figure(args, opts: FigureSettings, lam: dict | None) -> Drawn:
    """--summary (the evaluation's summary.csv: :func:`_read`) drawn; its rows are part of what the figure shows."""
    summary = _read(args.summary)
    lam = lam or {}
    # every method's hat and star rows are decoded at the record's lambda-hat and lambda*, Best-of-N's certified
    # settings at its procedures' lambdas: a record of another calibration is refused, unless it names every one of
    # those lambdas alike (pruned Best-of-N has its own record; a token-level decoder's own lambda is setting direct)
    record = {"hat": lam.get("lambda_hat"), "star": lam.get("lambda_star"),
              **{p: v.get("lambda") for p, v in (lam.get("procedures") or {}).items() if isinstance(v, dict)}}
    rows = summary[(summary["method"] != "bon_prune") & summary["setting"].isin(list(record))]
    for method, setting, decoded in zip(rows["method"], rows["setting"], rows["lambda"], strict=True):
        at = record.get(setting)
        if isinstance(at, int | float) and not math.isclose(float(decoded), at, rel_tol=1e-9, abs_tol=1e-12):
            from lara.read.files import DataError

            raise DataError(f"--lambda-json {args.lambda_json}: its {setting} lambda is {at:.6g}, but --summary "
                            f"{args.summary} decoded {method} {setting} at lambda {float(decoded):.6g}: another "
                            "calibration's record")
    return Drawn(tradeoff(summary, opts), summary=summary)
