"""``lara coverage-prune``: the coverage study of pruned Best-of-N's own calibration (``decode.bon_prune``).

The population is every prompt of the given prefix-score tables (the calibration samples and the test prompts'
candidates): for each, the decoder's expected cost, clipped cost, reward and tokens at every lambda of the grid
(:func:`lara.calibrate.pruned.curves`, computed once). Each repeat draws n prompts i.i.d. from the population,
calibrates on them with every procedure (bootstrap lambda*, CRC, LTT with Hoeffding-Bentkus and with betting
p-values) and reads the chosen lambda's population mean off the population curves: a violation is a population
mean clipped cost above tau. LTT promises a violation rate <= delta; CRC a mean clipped cost <= tau (over draws);
the bootstrap promises nothing. The decoder's cost need not be monotone in lambda: each search takes the stable
root (:mod:`lara.calibrate.pruned`), so this is exactly what the deployed calibration does, repeated.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from lara.decode.prune import Scheduled
from lara.evaluate.intervals import clopper_pearson
from lara.settings import (
    Settings,
    add_settings_arguments,
    cross_key,
    ordered_bounds,
    read_settings,
    seed_setting,
    setting,
)

log = logging.getLogger(__name__)

HELP = "coverage study of pruned Best-of-N's own calibration (bootstrap, CRC, LTT) on the scored prefix population"
OUTPUTS = ("out", "table")
PROCEDURES = ("bootstrap", "crc", "ltt", "ltt_wsr")


@dataclass(frozen=True)
class PruneCoverageSettings(Scheduled, Settings):
    """What the pruned decoder's coverage study reads (coverage, calibration and decode.bon_prune keys)."""

    checkpoints: list[float] = setting(help="The schedule's checkpoints.", exclusive_minimum=0,
                                       key="decode.bon_prune.checkpoints")
    keep: list[float] = setting(help="The schedule's survivors.", exclusive_minimum=0, key="decode.bon_prune.keep")
    grid_points: int = setting(help="The lambda grid.", minimum=2, key="decode.bon_prune.grid_points")
    max_subsets: int = setting(help="N-subsets per prompt.", minimum=1, key="decode.bon_prune.max_subsets")
    n: int = setting(help="Best-of-N candidates.", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response.", minimum=1, key="generation.max_new_tokens")
    tau: float = setting(help="The cost budget (the first listed one).", key="calibration.tau")
    quantile: float = setting(help="The bootstrap procedure's quantile.", exclusive_minimum=0, exclusive_maximum=1,
                              key="calibration.quantile")
    delta: float = setting(help="LTT's delta.", exclusive_minimum=0, exclusive_maximum=1, key="calibration.delta")
    cost_bounds: list[float] | None = setting(help="CRC and LTT's cost bounds (the study needs them).", length=2,
                                              key="calibration.cost_bounds")
    lambda_search_max: float = setting(help="The search interval's end.", exclusive_minimum=0,
                                       key="calibration.lambda_search_max")
    repeats: int = setting(200, "Calibration draws per size.", minimum=1, key="coverage.repeats")
    n_prompts: list[int] = setting([50, 100, 200], "Calibration sizes n.", minimum=1, key="coverage.n_prompts")
    bootstrap: int = setting(1000, "Bootstrap replicates inside each draw.", minimum=1, key="coverage.bootstrap")
    seed: int = seed_setting()

    @cross_key("calibration.cost_bounds", witness={"calibration": {"cost_bounds": [1.0, -1.0]}})
    def bounds_ordered(self):
        return ordered_bounds(self.cost_bounds, "calibration.cost_bounds")


def add_arguments(parser) -> None:
    parser.add_argument("--scores", nargs="+", required=True,
                        help="prefix-score tables (lara score-prefixes): together the population")
    add_settings_arguments(parser, PruneCoverageSettings)
    parser.add_argument("--out", required=True, help="coverage_bon_prune.json")
    parser.add_argument("--table", required=True, help="coverage_bon_prune.csv: one row per procedure and size")


def population(paths, s: PruneCoverageSettings):
    """The population's per-prompt curves (one Curves per table, stacked) on the grid."""
    from lara.calibrate import pruned
    from lara.decode.prune import read_prefix_scores
    from lara.read.files import DataError

    schedule = s.schedule()
    grid = np.linspace(0.0, s.lambda_search_max, s.grid_points)
    parts, seen = [], set()
    for path in paths:
        ids, ps, _, _ = read_prefix_scores(path, schedule, "--scores", s.max_new_tokens)
        twice = seen & set(map(str, ids))
        if twice:
            raise DataError(f"--scores {path}: prompt {sorted(twice)[0]!r} is in another table too: each population "
                            "prompt once")
        seen |= set(map(str, ids))
        if ps.shape[1] < schedule.n:
            raise DataError(f"--scores {path}: K = {ps.shape[1]} samples per prompt, fewer than N = {schedule.n}")
        parts.append(pruned.curves(ps, schedule, grid, s.cost_bounds, s.max_subsets, s.seed))
    fields = ("cost", "clipped", "reward", "tokens", "prefix_scored", "full_scored", "cost_se")
    stacked = {f: np.concatenate([getattr(c, f) for c in parts]) for f in fields}
    return pruned.Curves(grid, n_subsets=min(c.n_subsets for c in parts), exact=all(c.exact for c in parts),
                         **stacked)


def study(pop, s: PruneCoverageSettings) -> tuple[list[dict], dict]:
    """Rows per (n, procedure) and the population's own facts."""
    from lara.calibrate import pruned

    grid = pop.grid
    pop_cost = pop.clipped.mean(axis=0)
    pop_reward = pop.reward.mean(axis=0)
    pop_tokens = pop.tokens.mean(axis=0)
    oracle_idx, oracle_status = pruned.stable_root(pop_cost[None] <= s.tau)
    oracle = int(oracle_idx[0])
    rng = np.random.default_rng([s.seed, 4747])
    rows = []
    for n in s.n_prompts:
        chosen = {p: [] for p in PROCEDURES}
        feasible = {p: [] for p in PROCEDURES}
        for rep in range(s.repeats):
            idx = rng.integers(0, pop.clipped.shape[0], size=n)
            sub = pruned.Curves(grid, *(a[idx] for a in (pop.cost, pop.clipped, pop.reward, pop.tokens,
                                                           pop.prefix_scored, pop.full_scored)),
                                pop.n_subsets, pop.exact, pop.cost_se[idx])
            boot_idx, _ = pruned.bootstrap_roots(sub.cost, s.tau, s.bootstrap, s.seed * 100003 + rep)
            star = int(np.quantile(boot_idx, s.quantile, method="higher"))
            h = pruned.hat(sub, s.tau)
            found = {"bootstrap": pruned.Search(star, 0 if h.feasible else 2),
                     "crc": pruned.crc(sub, s.tau, s.cost_bounds),
                     "ltt": pruned.ltt(sub, s.tau, s.delta, s.cost_bounds, "hb"),
                     "ltt_wsr": pruned.ltt(sub, s.tau, s.delta, s.cost_bounds, "wsr", s.seed + rep)}
            for p, search in found.items():
                chosen[p].append(search.index)
                feasible[p].append(search.feasible)
        for p in PROCEDURES:
            at = np.asarray(chosen[p])
            ok = np.asarray(feasible[p])
            cost = pop_cost[at]
            # a procedure that certified nothing deploys nothing: counted apart, never as a violation
            viol = int(((cost > s.tau + 1e-12) & ok).sum())
            lo, hi = clopper_pearson(viol, len(at))
            rows.append({"n_prompts": n, "procedure": p, "repeats": len(at), "certified_share": float(ok.mean()),
                         "violations": viol, "violation_rate": viol / len(at), "violation_lo": lo,
                         "violation_hi": hi, "mean_population_cost": float(cost[ok].mean()) if ok.any() else None,
                         "mean_population_reward": float(pop_reward[at][ok].mean()) if ok.any() else None,
                         "reward_given_up": (float(pop_reward[oracle] - pop_reward[at][ok].mean())
                                             if ok.any() and oracle_status[0] != 2 else None),
                         "mean_tokens": float(pop_tokens[at][ok].mean()) if ok.any() else None,
                         "lambda_lo": float(np.quantile(grid[at], 0.025)),
                         "lambda_hi": float(np.quantile(grid[at], 0.975))})
    facts = {"n_prompts": int(pop.clipped.shape[0]), "lambda_pop": float(grid[oracle]),
             "lambda_pop_status": int(oracle_status[0]), "monotone": bool((np.diff(pop_cost) <= 1e-12).all()),
             "subsets": {"exact": pop.exact, "count": pop.n_subsets}}
    return rows, facts


def run(args) -> None:
    from lara import identity
    from lara.io import write_json
    from lara.read.files import write_table

    s = read_settings(args, PruneCoverageSettings)
    if s.cost_bounds is None:
        from lara.settings import ConfigError

        raise ConfigError("calibration.cost_bounds is null: the coverage study holds CRC and LTT to their promises, "
                          "which need fixed bounds")
    if not s.checkpoints:
        from lara.settings import ConfigError

        raise ConfigError("decode.bon_prune.checkpoints is empty: there is no pruned decoder to study")
    if not s.n_prompts:
        from lara.settings import ConfigError

        raise ConfigError("coverage.n_prompts is empty: no calibration size to study")
    pop = population(args.scores, s)
    log.info("population: %d prompts; %s; %d repeats per size %s", pop.clipped.shape[0], s.schedule().describe(),
             s.repeats, s.n_prompts)
    rows, facts = study(pop, s)
    for r in rows:
        log.info("n=%-4d %-9s certified %.2f violations %d/%d (%.3f [%.3f, %.3f]) mean cost %s", r["n_prompts"],
                 r["procedure"], r["certified_share"], r["violations"], r["repeats"], r["violation_rate"],
                 r["violation_lo"], r["violation_hi"], r["mean_population_cost"])
    table = pd.DataFrame(rows)
    write_table(table, args.table)
    write_json(args.out, {"rows": rows, "population": facts, "settings": asdict(s), "tau": s.tau, "delta": s.delta,
                          "schedule": s.schedule().as_dict(),
                          identity.KEY: identity.stamp("coverage_bon_prune", args.out,
                                                       made_from={f"--scores {i}": p
                                                                  for i, p in enumerate(args.scores)})})
