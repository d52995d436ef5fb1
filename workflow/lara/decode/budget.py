"""``lara choose-decoder``: at each token budget, the certified decoder to deploy (docs/budget.md states the rules).

The candidates are Best-of-k for every k <= N and the pruned schedules of a stated search space
(``decode.budget.checkpoints`` x ``keep``, one or two checkpoints), every one an instance of the calibration core's
decoder interface (:mod:`lara.calibrate.decoder`). Three disjoint prompt sets, each used for one thing: on the
**selection** prompts every candidate is calibrated by the deployed procedure and the winner at budget B is the one
with the most reward whose cost meets tau and whose tokens are at most B (ties to fewer tokens, then to Best-of-k), so
choosing costs neither certificate anything; the **calibration** prompts certify it (and every point of the frontier
figure) through the core (:func:`lara.calibrate.procedures.calibrate`); the **test** prompts audit it held out, with
its reward minus the best Best-of-k's at equal or fewer tokens, paired with a 95 % interval.

Writes the choice (JSON: budgets, winners, their records and audits, every candidate's selection numbers) and the
frontier table (CSV: Best-of-1..N and the schedules on the selection split's frontier, each at its certified lambda).
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd

from lara.calibrate.procedures import GridCalibration
from lara.calibrate.pruned import search_checkpoints_problem
from lara.settings import ConfigError, Settings, add_settings_arguments, cross_key, read_settings, seed_setting, setting

log = logging.getLogger(__name__)

HELP = "at each token budget, choose the certified decoder (Best-of-k or a pruned schedule) on a selection split"

OUTPUTS = ("out", "table")  # the files this step writes (checked before it computes: lara.cli.check_outputs)


@dataclass(frozen=True)
class BudgetSettings(GridCalibration, Settings):
    """decode.budget: the token budgets and the pruned schedules' search space (empty budgets: no chooser)."""

    SECTION: ClassVar[str] = "decode.budget"

    n: int = setting(help="Full Best-of-N's N (the largest k).", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response in tokens.", minimum=1, key="generation.max_new_tokens")
    grid_points: int = setting(help="The lambda grid.", minimum=2, key="decode.bon_prune.grid_points")
    max_subsets: int = setting(help="Subsets of a pruned decoder's expectation.", minimum=1,
                               key="decode.bon_prune.max_subsets")
    budgets: list[float] = setting(
        [], "Token budgets per prompt: a whole number of tokens, or a fraction in (0, 1) of full Best-of-N's tokens "
            "on the selection split. Empty: no chooser.", exclusive_minimum=0)
    checkpoints: list[int] = setting(
        [], "The search space's checkpoints, in generated tokens (each below generation.max_new_tokens).", minimum=1)
    keep: list[int] = setting([], "The search space's survivor counts (each below decode.bon_n).", minimum=1)
    max_checkpoints: int = setting(2, "Schedules of at most this many checkpoints (1 or 2) are searched.", minimum=1,
                                   maximum=2)
    ties: list[str] = setting(["index", "keep"], "The rules at a tied keep cut searched (decode.bon_prune.ties): "
                                                 "index, keep or both (each schedule once per rule).")
    eval_bootstrap: int = setting(2000, "Bootstrap replicates over test prompts.", minimum=1,
                                  key="evaluation.bootstrap")
    seed: int = seed_setting()

    @cross_key("decode.budget.budgets", witness={"decode": {"budget": {"budgets": [0.5, 0.5]}}})
    def budgets_distinct(self):
        if len(set(self.budgets)) != len(self.budgets):
            return f"decode.budget.budgets: {self.budgets} names a budget twice; each once"
        odd = [b for b in self.budgets if b >= 1 and b != round(b)]
        if odd:
            return (f"decode.budget.budgets: {odd[0]:g} is neither a whole number of tokens nor a fraction in (0, 1) "
                    "of full Best-of-N's tokens")

    @cross_key("decode.budget.checkpoints", "decode.budget.keep", witness={"decode": {"budget": {"checkpoints": []}}})
    def space_paired(self):
        if bool(self.checkpoints) != bool(self.keep):
            return (f"decode.budget.checkpoints: {self.checkpoints} with decode.budget.keep: {self.keep}; a search "
                    "space needs both (both empty: Best-of-k alone)")
        if len(set(self.checkpoints)) != len(self.checkpoints) or len(set(self.keep)) != len(self.keep):
            return "decode.budget.checkpoints: each value once, and each of decode.budget.keep once"

    @cross_key("decode.budget.checkpoints", "generation.max_new_tokens",
               witness={"decode": {"budget": {"checkpoints": [400], "keep": [2]}}})
    def checkpoints_stop(self):
        return search_checkpoints_problem(self.checkpoints, self.max_new_tokens)

    @cross_key("decode.budget.keep", "decode.bon_n", witness={"decode": {"budget": {"checkpoints": [2], "keep": [40]}}})
    def keep_stops(self):
        if any(m >= self.n for m in self.keep):
            return f"decode.budget.keep: {max(self.keep)} is not below decode.bon_n = {self.n} (it stops nothing)"

    @cross_key("decode.budget.ties", witness={"decode": {"budget": {"ties": ["first"]}}})
    def ties_known(self):
        if not self.ties or set(self.ties) - {"index", "keep"} or len(set(self.ties)) != len(self.ties):
            return f"decode.budget.ties: {self.ties}; name index, keep or both, each once"

    @property
    def enabled(self) -> bool:
        return bool(self.budgets)

    def schedules(self) -> list:
        """Every schedule of the search space: one checkpoint, or two with fewer survivors at the later one."""
        from lara.calibrate.pruned import make_schedule

        ts, ms = sorted(self.checkpoints), sorted(self.keep, reverse=True)
        out = [((t,), (m,)) for t in ts for m in ms]
        if self.max_checkpoints >= 2:
            out += [(ct, km) for ct in itertools.combinations(ts, 2) for km in itertools.combinations(ms, 2)]
        return [make_schedule(self.n, c, k, self.max_new_tokens, rule) for rule in self.ties for c, k in out]


def name_of(proto) -> str:
    """A candidate's short name: ``best_of_k:5`` (k), ``pruned:6@2,3@3`` (a schedule: keep @ checkpoint; ``+keep``
    where its tied cuts keep every tied candidate)."""
    if isinstance(proto, int):
        return f"best_of_k:{proto}"
    steps = ",".join(f"{m}@{t}" for t, m in zip(proto.checkpoints, proto.keep, strict=True))
    return f"pruned:{steps}" + ("" if proto.ties == "index" else f"+{proto.ties}")


@dataclass(frozen=True)
class Split:
    """One prompt set's tables, read once: prefix scores (P, K, J) at the search space's checkpoints."""

    role: str
    path: str
    ids: np.ndarray
    arrays: tuple
    checkpoints: tuple
    prompts: object

    def decoder(self, proto, n: int, max_subsets: int, seed: int):
        """``proto`` (a Best-of-k or a schedule) on this split's samples."""
        from lara.calibrate.best_of_k import BestOfK
        from lara.calibrate.pruned import PrefixScores, PrunedBestOfN

        reward, cost, length, pr, pc = self.arrays
        if isinstance(proto, int):
            return BestOfK(reward, cost, length, proto, n)
        cols = [self.checkpoints.index(t) for t in proto.checkpoints]
        return PrunedBestOfN(PrefixScores(reward, cost, length, pr[..., cols], pc[..., cols]), proto, max_subsets, seed)


def read_split(path: str, role: str, checkpoints, s: BudgetSettings) -> Split:
    from lara import identity
    from lara.read.candidates import read_prefix_scores
    from lara.read.files import DataError

    flag = f"--{role}"
    identity.expect_role(path, flag, role, f"the chooser reads each prompt set for one thing: {flag} is the {role} "
                         "prompts'")
    ids, arrays, _, df = read_prefix_scores(path, checkpoints, flag, s.max_new_tokens)
    if arrays[0].shape[1] < s.n:
        raise DataError(f"{flag} {path}: {arrays[0].shape[1]} samples per prompt, but Best-of-k up to decode.bon_n = "
                        f"{s.n} needs at least that many")
    return Split(role, path, ids, arrays, tuple(int(t) for t in checkpoints), identity.prompt_set(df, f"{flag} {path}"))


def deployed_on(c, s: BudgetSettings):
    """The deployed procedure's search alone on curves ``c`` (the selection split: no record, no statements)."""
    from lara.calibrate.procedures import bootstrap_roots, hat, searches

    boot = bootstrap_roots(c.cost, s.tau, s.bootstrap, s.seed)[0] if s.guarantee == "bootstrap" else np.zeros(1, int)
    return searches(c, s, s.seed, boot, hat(c, s.tau))[s.guarantee]


def on_selection(dec, s: BudgetSettings, grid) -> dict:
    """A candidate calibrated on the selection split, and its means there at that lambda."""
    c = dec.curves(grid, s.cost_bounds)
    found = deployed_on(c, s)
    at = c.at(found.index)
    return {"lambda": found.lam(grid), "feasible": found.feasible,
            "meets": bool(found.feasible and at["mean_cost"] <= s.tau + 1e-12 * max(1.0, abs(s.tau))), **at}


def choose(table: pd.DataFrame, budget_tokens: float) -> tuple[str | None, str | None, str | None]:
    """(winner, the best Best-of-k at equal or fewer tokens than the winner, the best Best-of-k within the budget) on
    the selection split's ``table`` (one row per candidate: name, kind, meets, mean_reward, mean_tokens): the winner
    has the most reward among those that meet tau within the budget; ties go to fewer tokens, then to Best-of-k."""
    ok = table[table["meets"] & (table["mean_tokens"] <= budget_tokens + 1e-9)]
    if ok.empty:
        return None, None, None
    ranked = ok.assign(pruned=ok["kind"] != "best_of_k").sort_values(
        ["mean_reward", "mean_tokens", "pruned"], ascending=[False, True, True], kind="stable")
    win = ranked.iloc[0]

    def best_of_k(tokens: float) -> str | None:
        bok = ok[(ok["kind"] == "best_of_k") & (ok["mean_tokens"] <= tokens + 1e-9)]
        bok = bok.sort_values(["mean_reward", "mean_tokens"], ascending=[False, True], kind="stable")
        return str(bok.iloc[0]["name"]) if len(bok) else None

    return str(win["name"]), best_of_k(win["mean_tokens"]), best_of_k(budget_tokens)


def frontier(table: pd.DataFrame) -> list[str]:
    """The schedules no other schedule beats on the selection split (as much reward or more at as few tokens or
    fewer, one of them strictly): the pruned points of the frontier figure."""
    pr = table[(table["kind"] != "best_of_k") & table["meets"]]
    r, t = pr["mean_reward"].to_numpy(float), pr["mean_tokens"].to_numpy(float)
    ri, ti = r[:, None], t[:, None]  # [i, j]: schedule j beats schedule i
    beaten = ((r >= ri) & (t <= ti) & ((r > ri) | (t < ti))).any(axis=1)
    return [str(name) for name in pr["name"][~beaten]]


def held_out(dec, lam: float, s: BudgetSettings) -> tuple[dict, dict]:
    """The decoder on the test prompts at ``lam``: its audit (means with intervals, the verdict) and per-prompt
    reward."""
    from lara.stats import interval, verdict

    c = dec.curves(np.array([lam]), None)
    out = {}
    for name, v in (("mean_reward", c.reward), ("mean_cost", c.cost), ("mean_tokens", c.tokens)):
        mean, lo, hi, lower, upper = interval(v, s.eval_bootstrap, s.seed)
        out[name] = float(mean[0])
        out[f"{name}_ci95"] = [float(lo[0]), float(hi[0])]
        if name == "mean_cost":
            out["one_sided95"] = [float(lower[0]), float(upper[0])]
    out["verdict"] = verdict(*out["one_sided95"], s.tau, c.n_prompts)
    return out, {"reward": c.reward[:, 0]}


def add_arguments(parser) -> None:
    parser.add_argument("--selection", required=True,
                        help="the selection prompts' samples with prefix scores (lara score-prefixes)")
    parser.add_argument("--calibration", required=True, help="the calibration prompts' samples with prefix scores")
    parser.add_argument("--test", required=True, help="the test prompts' N candidates with prefix scores")
    add_settings_arguments(parser, BudgetSettings)
    parser.add_argument("--out", required=True, help="the choice (JSON)")
    parser.add_argument("--table", required=True, help="the frontier (CSV): every candidate of the figure, held out")


def read_splits(args, s: BudgetSettings) -> tuple[Split, Split, Split]:
    """The three prompt sets, each in its role, pairwise disjoint, with the samples every candidate needs."""
    from lara import identity
    from lara.calibrate import procedures
    from lara.read.files import DataError

    checkpoints = sorted(set(s.checkpoints))
    sel, cal, test = (read_split(getattr(args, r), r, checkpoints, s) for r in ("selection", "calibration", "test"))
    for a, b in ((sel, cal), (sel, test), (cal, test)):
        if identity.disjoint(a.prompts, b.prompts, f"--{a.role} {a.path} against --{b.role} {b.path}"):
            raise DataError(f"--{b.role} {b.path}: shares prompts with --{a.role} {a.path}; the selection, "
                            "calibration and test prompts must be disjoint (choosing on them would spend the "
                            "certificate or the audit)")
    if test.arrays[0].shape[1] != s.n:
        raise DataError(f"--test {test.path}: {test.arrays[0].shape[1]} candidates per prompt, but the decoders draw "
                        f"N = {s.n} (decode.bon_n)")
    for sp in (sel, cal):
        procedures.check_floors(len(sp.ids), sp.arrays[0].shape[1], None, sp.decoder(s.n, s.n, 1, 0),
                                f"--{sp.role} {sp.path}")
    return sel, cal, test


def select(sel: Split, protos: dict, s: BudgetSettings) -> pd.DataFrame:
    """Every candidate calibrated on the selection prompts: one row each (name, kind, lambda, meets, means)."""
    grid = np.linspace(0.0, s.lambda_search_max, s.grid_points)
    rows = []
    for i, (name, proto) in enumerate(protos.items(), 1):
        found = on_selection(sel.decoder(proto, s.n, s.max_subsets, s.seed), s, grid)
        rows.append({"name": name, "kind": "best_of_k" if isinstance(proto, int) else "pruned", **found})
        if i % 50 == 0 or i == len(protos):
            log.info("selection: %d of %d candidates calibrated", i, len(protos))
    return pd.DataFrame(rows)


def settle(b: dict, sel_by: pd.DataFrame, rec: dict, audit: dict, rewards: dict, n_test: int,
           s: BudgetSettings) -> None:
    """A budget's winner in its record: its selection numbers, certificate and held-out audit, and its reward minus
    the best Best-of-k's (at equal or fewer tokens; within the budget): on the selection prompts never below zero by
    construction, on the test prompts paired, with its 95 % interval."""
    from lara.stats import paired_difference

    row = sel_by.loc[b["chosen"]]
    b["selection"] = {k: (bool(row[k]) if k in ("feasible", "meets") else float(row[k]))
                      for k in ("lambda", "feasible", "meets", "mean_cost", "mean_reward", "mean_tokens")}
    b["deployed"] = {k: rec[k] for k in ("decoder", "lambda_star", "feasible", "guarantee", "procedures")}
    b["held_out"] = audit | {"tau": s.tau, "n_prompts": n_test}
    for key, rival in (("versus_best_of_k", b["best_of_k"]), ("versus_best_of_k_in_budget", b["best_of_k_in_budget"])):
        b[key] = None if rival is None else {  # None: a schedule cheaper than every Best-of-k that meets tau
            "best_of_k": rival, "selection_reward_gain": float(row["mean_reward"] - sel_by.loc[rival, "mean_reward"]),
            "test_reward_gain": paired_difference(rewards[b["chosen"]], rewards[rival], s.eval_bootstrap, s.seed)}
    log.info("budget %g: deploy %s at lambda* %.4g (%s), held out: reward %.4f, cost %.4f %s, %.1f tokens; against "
             "Best-of-k at as few tokens: %s; within the budget: %s", b["budget"], b["chosen"], rec["lambda_star"],
             s.guarantee, audit["mean_reward"], audit["mean_cost"], audit["verdict"], audit["mean_tokens"],
             b["versus_best_of_k"], b["versus_best_of_k_in_budget"])


def frontier_table(shown: list, sel_by: pd.DataFrame, certified: dict, audits: dict, budgets: list, n_test: int,
                   tau: float) -> pd.DataFrame:
    """frontier.csv: each decoder drawn, at its certified lambda, held out, with the budgets it was chosen at."""
    chosen_at = {}
    for b in budgets:
        if b["chosen"]:
            chosen_at.setdefault(b["chosen"], []).append(f"{b['budget']:g}")
    return pd.DataFrame([{
        "name": name, "kind": sel_by.loc[name, "kind"],
        "selection_lambda": sel_by.loc[name, "lambda"], "selection_meets": bool(sel_by.loc[name, "meets"]),
        "selection_reward": sel_by.loc[name, "mean_reward"], "selection_tokens": sel_by.loc[name, "mean_tokens"],
        "lambda_star": certified[name]["lambda_star"], "feasible": certified[name]["feasible"],
        "tokens": audits[name]["mean_tokens"], "mean_reward": audits[name]["mean_reward"],
        "mean_reward_lo": audits[name]["mean_reward_ci95"][0], "mean_reward_hi": audits[name]["mean_reward_ci95"][1],
        "mean_cost": audits[name]["mean_cost"], "mean_cost_lower": audits[name]["one_sided95"][0],
        "mean_cost_upper": audits[name]["one_sided95"][1], "verdict": audits[name]["verdict"], "tau": tau,
        "tied_cut_share": (certified[name].get("ties") or {}).get("tied_cut_share_at_lambda_star", float("nan")),
        "chosen_at": " ".join(chosen_at.get(name, [])), "n_prompts": n_test} for name in shown])


def run(args) -> None:
    from lara import identity
    from lara.calibrate import procedures
    from lara.io import write_json
    from lara.provenance import code_version
    from lara.read.files import write_table
    from lara.stats import check_replicates

    s = read_settings(args, BudgetSettings)
    if not s.enabled:
        raise ConfigError("decode.budget.budgets is empty: there is no budget to choose a decoder for")
    check_replicates(s.eval_bootstrap)
    schedules = s.schedules()
    sel, cal, test = read_splits(args, s)
    protos = {name_of(p): p for p in [*range(1, s.n + 1), *schedules]}
    table = select(sel, protos, s)
    full = float(sel.arrays[2].mean(axis=1).mean() * s.n)
    log.info("selection: %d prompts, %d candidates (%d schedules); full Best-of-%d %.1f tokens per prompt",
             len(sel.ids), len(table), len(schedules), s.n, full)
    budgets = []
    for b in s.budgets:
        tokens = float(b) * full if b < 1 else float(b)
        win, rival, in_budget = choose(table, tokens)
        budgets.append({"budget": b, "tokens": tokens, "chosen": win, "best_of_k": rival,
                        "best_of_k_in_budget": in_budget})
        log.info("budget %g (%.1f tokens per prompt): %s (Best-of-k at equal or fewer tokens: %s)", b, tokens,
                 win or "nothing fits", rival)
    shown = [f"best_of_k:{k}" for k in range(1, s.n + 1)] + frontier(table)
    shown += [x for b in budgets for x in (b["chosen"],) if x and x not in shown]
    certified, audits, rewards = {}, {}, {}
    for name in shown:  # certified on the calibration prompts by the core, then held out on the test prompts
        certified[name] = procedures.calibrate(cal.decoder(protos[name], s.n, s.max_subsets, s.seed), s,
                                               cal.arrays[1], f"--calibration {cal.path}")
        audits[name], per = held_out(test.decoder(protos[name], s.n, s.max_subsets, s.seed),
                                     certified[name]["lambda_star"], s)
        rewards[name] = per["reward"]
    sel_by = table.set_index("name")
    for b in budgets:
        if b["chosen"] is not None:
            settle(b, sel_by, certified[b["chosen"]], audits[b["chosen"]], rewards, test.prompts.n, s)
    write_table(frontier_table(shown, sel_by, certified, audits, budgets, test.prompts.n, s.tau), args.table)
    made = identity.stamp("budget_choice", args.out, tau=s.tau, procedure=s.guarantee,
                          splits={sp.role: sp.prompts.record() for sp in (sel, cal, test)},
                          frontier=identity.file_digest(args.table),  # the table written beside it, for its readers
                          made_from={"--selection": sel.path, "--calibration": cal.path, "--test": test.path})
    doc = {"budgets": budgets, "tau": s.tau, "procedure": s.guarantee, "full_best_of_n_tokens": full,
           "candidates": table.to_dict("records"),
           "search_space": {"checkpoints": s.checkpoints, "keep": s.keep, "max_checkpoints": s.max_checkpoints,
                            "schedules": len(schedules)},
           "splits": {sp.role: {"path": sp.path, "n_prompts": len(sp.ids)} for sp in (sel, cal, test)},
           "settings": asdict(s), "code": code_version(), identity.KEY: made}
    try:
        write_json(args.out, doc)
    except BaseException:
        Path(args.table).unlink(missing_ok=True)  # never the table without its choice
        raise
