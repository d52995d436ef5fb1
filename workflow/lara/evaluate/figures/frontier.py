"""``lara figure --kind frontier``: the token-budget chooser (``lara choose-decoder``): held-out mean reward against
tokens per prompt, each decoder at its own certified lambda*, with each budget and the decoder chosen at it."""

from __future__ import annotations

import math

import pandas as pd

from lara.evaluate.figures.common import Drawn, FigureSettings, check_record, key, panels
from lara.stats import VERDICTS

COLUMNS = ("name", "kind", "lambda_star", "tokens", "mean_reward", "mean_reward_lo", "mean_reward_hi",
           "mean_cost_lower", "mean_cost_upper", "tau", "n_prompts", "verdict")
KINDS = ("best_of_k", "pruned")


def largest_k(table: pd.DataFrame) -> int:
    """N, the largest k of the Best-of-k rows (named best_of_k:K)."""
    return int(table.loc[table["kind"] == "best_of_k", "name"].str.removeprefix("best_of_k:").astype(int).max())


def _points(ax, rows: pd.DataFrame, colour, marker: str) -> None:
    """Each row's held-out reward with its 95 % interval as a bar; met filled, any other verdict hollow."""
    yerr = [rows["mean_reward"] - rows["mean_reward_lo"], rows["mean_reward_hi"] - rows["mean_reward"]]
    ax.errorbar(rows["tokens"], rows["mean_reward"], yerr=yerr, fmt="none", ecolor=colour, elinewidth=0.9,
                capsize=2, alpha=0.7)
    met = rows["verdict"] == VERDICTS[0]
    for shown, face in ((rows[met], colour), (rows[~met], "white")):
        ax.plot(shown["tokens"], shown["mean_reward"], ls="none", marker=marker, ms=5.5, mfc=face, mec=colour,
                mew=1.3, zorder=3)


def frontier(table: pd.DataFrame, choice: dict, opts: FigureSettings):
    """Best-of-k for k = 1..N as a line with its bootstrap 95 % band, the pruned schedules as points with their 95 %
    bars (hollow where the held-out verdict is not met), a dashed line at each budget's tokens per prompt (on the
    selection split, where the choice was made) and a star on the decoder chosen at it."""
    pal, fig, ax = panels(opts, height=1.8)
    bok = table[table["kind"] == "best_of_k"].sort_values("tokens")
    ax.plot(bok["tokens"], bok["mean_reward"], color=pal[0], lw=1.6, zorder=2)
    ax.fill_between(bok["tokens"], bok["mean_reward_lo"], bok["mean_reward_hi"], color=pal[0], alpha=0.15, lw=0)
    _points(ax, bok, pal[0], "o")
    _points(ax, table[table["kind"] == "pruned"], pal[1], "s")
    for end in (bok.iloc[0], bok.iloc[-1]):
        ax.annotate(end["name"].replace("best_of_k:", "k = "), (end["tokens"], end["mean_reward"]),
                    xytext=(6, -12), textcoords="offset points", fontsize="x-small", color=pal[0])
    by_name = table.set_index("name")
    for i, b in enumerate(choice["budgets"]):  # each choice named in the empty lower right, an arrow to its star
        ax.axvline(b["tokens"], color="grey", ls="--", lw=1.1, zorder=1)
        ax.text(b["tokens"], 0.99, f"B = {b['budget']:g} ", transform=ax.get_xaxis_transform(), rotation=90,
                va="top", ha="right", fontsize="x-small", color="dimgrey")
        text, at = f"budget {b['budget']:g} ({b['tokens']:.0f} tokens): nothing fits", None
        if b.get("chosen") is not None:
            r = by_name.loc[b["chosen"]]
            at = (r["tokens"], r["mean_reward"])
            ax.plot(*at, marker="*", ms=17, color=pal[2], mec="black", mew=0.8, ls="none", zorder=4)
            text = (f"budget {b['budget']:g} ({b['tokens']:.0f} tokens): {b['chosen']}, "
                    f"$\\lambda^*$ = {r['lambda_star']:.3g}, {r['verdict'].split(' ')[0]}")
        place = (0.98, 0.04 + 0.08 * i)
        arrow = {"arrowstyle": "-", "color": "grey", "lw": 0.7, "shrinkB": 9, "relpos": (0, 0.5)} if at else None
        ax.annotate(text, at or place, xycoords="data" if at else "axes fraction", xytext=place,
                    textcoords="axes fraction", ha="right", va="bottom", fontsize="x-small", arrowprops=arrow,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "lightgrey", "alpha": 0.9})
    n = largest_k(table)
    handles = [key(color=pal[0], marker="o", label=f"Best-of-k, k = 1…{n} (band: 95% CI)"),
               key(color=pal[1], marker="s", ls="none", label="pruned schedule (bars: 95% CI)"),
               key(color="grey", marker="o", mfc="white", ls="none",
                   label="hollow: held-out verdict not met (inconclusive or violated)"),
               key(color="grey", ls="--", label="budget: tokens per prompt (selection split)"),
               key(color=pal[2], marker="*", ms=12, mec="black", ls="none", label="chosen at the budget")]
    ax.set(xlabel="tokens per prompt (held-out test prompts)", ylabel="mean reward (held out)",
           title=f"each decoder at its certified $\\lambda^*$ ($\\tau$ = {float(table['tau'].iloc[0]):g}, "
                 f"{int(table['n_prompts'].iloc[0])} test prompts)")
    fig.legend(handles=handles, loc="outside lower center", ncol=2, frameon=False)
    return fig


def read_frontier(path: str) -> pd.DataFrame:
    """frontier.csv (lara choose-decoder --table): its columns, finite numbers, known kinds, one tau and prompt count,
    at least one Best-of-k, and every verdict the one its own bounds give (an edited verdict is refused)."""
    from lara.read.files import DataError, read_table, require_finite, require_rows
    from lara.stats import verdict

    where = f"--frontier {path}"
    table = require_finite(require_rows(read_table(path, required=COLUMNS, where=where), where), COLUMNS[2:11], where)
    unknown = sorted(set(table["kind"]) - set(KINDS))
    if unknown or not (table["kind"] == "best_of_k").any():
        raise DataError(f"{where}: kinds {unknown or 'without best_of_k'}; expected best_of_k rows and pruned rows")
    named = table.loc[table["kind"] == "best_of_k", "name"].astype(str)
    odd = named[~named.str.fullmatch(r"best_of_k:[1-9]\d*")]
    if len(odd):
        raise DataError(f"{where}: best_of_k row {odd.iloc[0]!r} is not named best_of_k:K (K = 1, 2, ...)")
    for col in ("tau", "n_prompts"):
        if table[col].nunique() != 1:
            raise DataError(f"{where}: column {col!r} holds several values; one run's frontier has one")
    for r in table.itertuples():
        want = verdict(r.mean_cost_lower, r.mean_cost_upper, r.tau, int(r.n_prompts))
        if r.verdict != want:
            raise DataError(f"{where}: {r.name}'s verdict {r.verdict!r}, but its own bounds and tau give {want!r}")
    return table


def read_choice(path: str, table: pd.DataFrame, frontier_path: str) -> dict:
    """choice.json (lara choose-decoder): its budgets (a number and tokens each), its tau the frontier's, and every
    decoder it chose a row of the frontier."""
    from lara.identity import KEY, file_digest
    from lara.read.files import DataError, json_file

    where = f"--choice {path}"
    choice = json_file(path, where)
    stated = (choice.get(KEY) or {}).get("frontier")
    if stated != file_digest(frontier_path):  # choose-decoder writes the two together and names the table's digest
        raise DataError(f"{where}: made beside the frontier table {stated}, not --frontier {frontier_path} "
                        f"({file_digest(frontier_path)}); draw a choice with the table written beside it")
    budgets = choice.get("budgets")
    numbers = ("budget", "tokens")
    if not isinstance(budgets, list) or not budgets or not all(
            isinstance(b, dict) and all(isinstance(b.get(k), int | float) and math.isfinite(b[k]) for k in numbers)
            for b in budgets):
        raise DataError(f"{where}: budgets is not a list of records with a finite budget and tokens")
    if not math.isclose(float(choice["tau"]), float(table["tau"].iloc[0]), rel_tol=1e-9, abs_tol=1e-12):
        raise DataError(f"{where}: tau {choice['tau']:g}, but --frontier {frontier_path} is for tau "
                        f"{table['tau'].iloc[0]:g}; inputs of one run agree")
    for b in budgets:
        if b.get("chosen") is not None and b["chosen"] not in set(table["name"]):
            raise DataError(f"{where}: budget {b['budget']:g} chose {b['chosen']!r}, which --frontier "
                            f"{frontier_path} does not list; inputs of one run agree")
    return choice


def figure(args, opts: FigureSettings, lam: dict | None) -> Drawn:
    """--frontier (frontier.csv) and --choice (choice.json) drawn; the budgets, their choices and the decoders whose
    held-out verdict is not met are part of what the figure shows; --lambda-json, when given, is full Best-of-N's
    record for the frontier's tau and N."""
    table = read_frontier(args.frontier)
    choice = read_choice(args.choice, table, args.frontier)
    check_record(lam, args.lambda_json, float(table["tau"].iloc[0]), largest_k(table),
                 f"--frontier {args.frontier} (its Best-of-k up to k = N)")
    rows = table.set_index("name")
    budgets = [{"budget": b["budget"], "tokens": round(b["tokens"], 1), "chosen": b.get("chosen")}
               | ({"lambda_star": float(rows.loc[b["chosen"], "lambda_star"]),
                   "mean_reward": round(float(rows.loc[b["chosen"], "mean_reward"]), 4),
                   "verdict": rows.loc[b["chosen"], "verdict"]} if b.get("chosen") else {})
               for b in choice["budgets"]]
    splits = {k: v.get("n_prompts") for k, v in (choice.get("splits") or {}).items() if isinstance(v, dict)}
    extra = {"tau": float(table["tau"].iloc[0]), "test_prompts": int(table["n_prompts"].iloc[0]),
             "n": largest_k(table), "pruned": int((table["kind"] == "pruned").sum()),
             "procedure": choice.get("procedure"), "splits": splits, "budgets": budgets,
             "not_met": sorted(table.loc[table["verdict"] != VERDICTS[0], "name"])}
    return Drawn(frontier(table, choice, opts), extra)
