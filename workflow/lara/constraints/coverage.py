"""``lara coverage-vector``: how often each vector-lambda procedure misses some tau, measured on a scored
population (the coverage study of :mod:`lara.calibrate.coverage`, for several constraints at once).

    lara coverage-vector --scores constraints/calibration_scores.parquet constraints/bon_scores.parquet \\
        --constraints '[...]' --calibration-settings '{...}' --settings '{...}' --out coverage.json \\
        --table coverage.csv

The study of :mod:`lara.calibrate.coverage` (its docstring: the population of the tables' prompts, each with its K
scored samples; ``coverage.repeats`` i.i.d. draws of n prompts per size n and K; everything evaluated exactly on the
population), on constraint-score tables (one row per response: prompt_id, reward, cost_<name> per constraint, as
``lara score-constraints`` writes them), with a vector lambda: the population's mean Best-of-N cost vector and reward
at any lambda are :func:`lara.calibrate.vector.expected_vector`'s, and lambda_pop, for reference, is the smallest s
along the population's soft-dual direction whose mean cost meets every tau
(:func:`lara.calibrate.vector.bon_along_soft_direction` on the whole population). Each draw (drawn as the scalar
study draws them) is calibrated with each procedure of ``lara calibrate-vector``, its own code (with
``coverage.bootstrap`` replicates in place of ``calibration.bootstrap``, as the scalar study does, and a seed of the
draw's own): ``hat`` and ``bootstrap`` promise nothing; ``ltt`` (Pareto Testing, Hoeffding-Bentkus) and ``ltt_wsr``
(the same split and ray, betting p-values: certifying more where the losses spread little) promise that the
probability over draws of a certified lambda missing some tau (for the costs clipped to their bounds) is <= delta.
With one constraint ``calibrate-vector`` runs the scalar calibration, and so does this study: the scalar study's
procedures (bootstrap, CRC, LTT, betting LTT; :func:`lara.calibrate.coverage.calibrate_draw`) and lambda-hat, their
lambdas 1-vectors.

Per procedure and size: the JOINT violation rate (some constraint's population mean cost > its tau) with its
Clopper-Pearson 95 % interval, each constraint's own violation rate, the mean population cost (and clipped cost)
per constraint, the mean reward, the reward given up against lambda_pop, the 2.5-97.5 % band of each lambda
coordinate, and the share of draws whose procedure reported ``feasible: false`` (for LTT: certified nothing).
Such a draw deploys nothing (``calibrate-vector`` refuses it without ``--allow-infeasible``), so it counts as
not feasible, never as a violation: LTT's promise bounds the chance of certifying a lambda that misses. The rate
at the lambda the procedure returns anyway (the end of the search) is reported beside it (``returned_miss_rate``).
Each procedure's promise is stated with whether the measured interval is consistent with it (LTT: the
Clopper-Pearson interval reaches delta or below; CRC: the mean clipped cost is within two standard errors of
tau or below).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace

import numpy as np
import pandas as pd

from lara.calibrate.calibrate import CalibrationSettings
from lara.calibrate.coverage import (
    CoverageSettings,
    Curves,
    calibrate_draw,
    draw,
    lambda_band,
    log_progress,
    population,
    repeat_draws,
    sample_sizes,
    violation_summary,
)
from lara.calibrate.vector import slack
from lara.settings import SEED_MAX, ConfigError, add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "coverage study of the vector lambda: joint violation rate of each procedure against delta"
OUTPUTS = ("out", "table")

VECTOR_PROCEDURES = ("hat", "bootstrap", "ltt", "ltt_wsr")  # several constraints: lara calibrate-vector's
SCALAR_PROCEDURES = ("hat", "bootstrap", "crc", "ltt", "ltt_wsr")  # one constraint: the scalar calibration's
LTT_BOUNDS = {"ltt": "Hoeffding-Bentkus", "ltt_wsr": "betting"}  # each LTT procedure's p-values
STREAM = 27  # the scalar study's random stream ([seed, 27]): one constraint draws exactly what it draws


def check_settings(cal: CalibrationSettings, cov: CoverageSettings, m: int) -> None:
    """The values both settings carry come from the same config keys; refuse two different ones (a hand-given
    flag on one side), naming the key. Refuse what the study cannot measure: what calibrate-vector refuses for
    ``m`` constraints, and the sizes the other coverage studies refuse."""
    from lara.calibrate.procedures import check_sizes
    from lara.constraints.calibrate import check_calibration

    cal_keys = {CalibrationSettings.key(f): f for f in cal.__dataclass_fields__}
    for field, key in CoverageSettings.borrowed().items():
        if key in cal_keys and getattr(cov, field) != getattr(cal, cal_keys[key]):
            raise ConfigError(f"{key}: --settings gives {getattr(cov, field)!r} but --calibration-settings "
                              f"{getattr(cal, cal_keys[key])!r}; both are built from the one config key (the study "
                              "must measure the deployed calibration)")
    check_calibration(cal, m)
    check_sizes(cov.n_prompts)  # the scalar and grid studies' floor: a size, each of at least two prompts


def population_at(pop, lams: np.ndarray, n: int, bounds) -> np.ndarray:
    """(L, 2m + 1): the population's mean expected Best-of-n cost vector, clipped cost vector and reward at each
    vector lambda (rows of ``lams``): :func:`lara.calibrate.vector.expected_vector`'s computation (the same
    ranking cost), with the clipped costs and the reward averaged beside the costs; ``bounds``: one [lo, hi] for
    every cost, or one per cost."""
    from lara.calibrate.vector import clip_each, columns, expected_at

    values = [*columns(pop.costs), *columns(clip_each(pop.costs, bounds)), pop.reward]
    return np.array([expected_at(pop.reward, pop.costs, pop.mask, lam, n, *values).mean(axis=1) for lam in lams])


def promises(m: int, cal: CalibrationSettings) -> dict:
    out = {"hat": {"promise": "none (the plug-in root on the draw)", "bound": None},
           "bootstrap": {"promise": f"none (nominal: the {cal.quantile:g} quantile of the prompt bootstrap; a "
                                    "heuristic upper bound)", "bound": None},
           **{name: {"promise": f"joint violation rate <= delta = {cal.delta:g} (every constraint at once, for the "
                                f"costs clipped to their bounds; an uncertified draw deploys nothing; {how})",
                     "bound": cal.delta} for name, how in LTT_BOUNDS.items()}}
    if m == 1:
        out["crc"] = {"promise": "mean over draws of the population's clipped cost <= tau", "bound": None}
        for name, how in LTT_BOUNDS.items():
            out[name]["promise"] = (f"violation rate <= delta = {cal.delta:g} (for the costs clipped to their "
                                    f"bounds; {how})")
    return out


def _run_draws(pop, ks: list, k_pop: int, tau, cal: CalibrationSettings, cov: CoverageSettings, limits, procs,
               progress=None) -> list[dict]:
    """Every draw (K, n, repeat) calibrated: each procedure's lambda and whether it deploys one."""
    from lara.calibrate.dual import PromptScores
    from lara.constraints.calibrate import _vector

    m = len(tau)
    if m == 1:
        pop1 = PromptScores(pop.reward, pop.costs[..., 0], pop.mask, pop.prompt_ids)
        s1 = replace(cov, tau=float(tau[0]), cost_bounds=limits[0])
        whole = Curves.of(pop1, s1)  # every draw of whole prompts is a weighting of these
    rng = np.random.default_rng([cov.seed, STREAM])

    def one(n, k):
        if m == 1:  # the scalar study's procedures and lambda-hat, as ``lara calibrate`` computes them
            chosen = calibrate_draw(pop1, whole, n, k, s1, rng, hat=True)
            return {p: ([float(chosen[p][0])], bool(chosen[p][1])) for p in procs}
        idx, sub = draw(pop, rng, n, k, "costs")
        if sub is None:  # every sample of each drawn prompt
            sub = type(pop)(pop.reward[idx], pop.costs[idx], pop.mask[idx], pop.prompt_ids[idx])
        # ``lara calibrate-vector``'s own procedures (not its 2-D brute-force check, a diagnostic) with the study's
        # bootstrap replicates and a seed of the draw's own; a lambda-hat that meets no tau up to the search's end
        # is returned, like LTT's, as the end of the search along its direction, not feasible
        found = _vector(sub, tau, cov.bon_n, replace(cal, bootstrap=cov.bootstrap, seed=int(rng.integers(0, SEED_MAX))),
                        limits)["procedures"]
        end = (cov.lambda_search_max * np.asarray(found["hat"]["direction"])).tolist()
        return {p: (list(found[p]["lambda"] or end), bool(found[p]["feasible"])) for p in procs}

    return repeat_draws(ks, k_pop, cov, one, progress)


def _at_population(pop, rows: list[dict], names, tau, bon_n: int, limits) -> pd.DataFrame:
    """The draws with each lambda's exact population costs, clipped costs and reward, and its misses."""
    m = len(names)
    draws = pd.DataFrame(rows)
    lams = np.array(draws.pop("lambda").tolist(), dtype=float).reshape(len(draws), m)
    uniq, inv = np.unique(lams, axis=0, return_inverse=True)
    at = population_at(pop, uniq, bon_n, limits)[inv.ravel()]  # (rows, 2m + 1)
    for j, name in enumerate(names):
        draws[f"lambda_{name}"] = lams[:, j]
    for j, name in enumerate(names):
        draws[f"population_cost_{name}"] = at[:, j]
        draws[f"population_clipped_cost_{name}"] = at[:, m + j]
    draws["population_reward"] = at[:, 2 * m]
    misses = at[:, :m] > (tau + slack(tau))[None, :]
    for j, name in enumerate(names):
        draws[f"violated_{name}"] = draws["feasible"].to_numpy() & misses[:, j]
    draws["misses"] = misses.any(axis=1)  # at the returned lambda, deployed or not
    draws["violated"] = draws["feasible"] & draws["misses"]  # a deployed lambda missing some tau
    return draws


def _summary_row(g: pd.DataFrame, proc: str, names, tau, cal: CalibrationSettings, reward_pop) -> dict:
    """One (K, n, procedure) group of draws: the joint and per-constraint violation rates, the population costs,
    reward and lambdas, and whether the rate is consistent with the procedure's promise."""
    reps = len(g)
    row = {"procedure": proc, "n": int(g["n"].iloc[0]), "k": int(g["k"].iloc[0]), **violation_summary(g)}
    for key, column in (("violation_rate", "violated"), ("mean_population_cost", "population_cost"),
                        ("mean_population_clipped_cost", "population_clipped_cost")):
        row |= {f"{key}_{name}": float(g[f"{column}_{name}"].mean()) for name in names}
    row["mean_reward"] = float(g["population_reward"].mean())
    row["reward_given_up"] = None if reward_pop is None else reward_pop - row["mean_reward"]
    for name in names:
        row |= lambda_band(g[f"lambda_{name}"], f"_{name}")
    row["infeasible_rate"] = float((~g["feasible"]).mean())
    row["returned_miss_rate"] = float(g["misses"].mean())
    if proc in ("ltt", "ltt_wsr"):
        row["promise_consistent"] = bool(row["violation_lo"] <= cal.delta)
    elif proc == "crc":
        clipped = g[f"population_clipped_cost_{names[0]}"]
        se = float(clipped.std(ddof=1) / np.sqrt(reps)) if reps > 1 else 0.0
        row["promise_consistent"] = bool(clipped.mean() - 2 * se <= tau[0] + slack(tau)[0])
    else:
        row["promise_consistent"] = None
    return row


def study(pop, constraints, cal: CalibrationSettings, cov: CoverageSettings, progress=None) -> tuple[dict,
                                                                                                      pd.DataFrame]:
    """The coverage study of the module docstring on the population ``pop`` (a VectorScores): its record
    (population, promises, the summary per procedure, size and K) and the per-draw rows."""
    from lara.calibrate.decoder import clipped_share
    from lara.calibrate.vector import bon_along_soft_direction
    from lara.constraints.spec import bounds as cost_bounds

    check_settings(cal, cov, len(constraints))
    names = [c.name for c in constraints]
    tau = np.array([c.tau for c in constraints], dtype=float)
    m = len(constraints)
    if pop.costs.shape[2] != m:
        raise ValueError(f"the scores hold {pop.costs.shape[2]} costs for {m} constraints")
    k_pop = int(pop.mask.sum(axis=1).min())
    ks = sample_sizes(k_pop, cov)  # (each n >= 2, as LTT's split of a draw in two needs: check_settings)
    t0 = time.perf_counter()
    ref = bon_along_soft_direction(pop.reward, pop.costs, pop.mask, tau, cov.bon_n, cal.beta, cov.lambda_search_max)
    lam_pop = ref["lambda"]
    limits = cost_bounds(constraints, cov.cost_bounds)  # each constraint's own, else calibration.cost_bounds
    if limits is None:
        raise ConfigError("calibration.cost_bounds: the coverage study measures LTT's promise against the "
                          "bootstrap's; LTT needs fixed cost bounds [lo, hi] (calibration.cost_bounds or each "
                          "constraint's bounds)")
    live = pop.costs[pop.mask]
    clipped_fraction = {name: clipped_share(live[:, j], limits[j]) | {"bounds": limits[j]}
                        for j, name in enumerate(names)}
    procs = SCALAR_PROCEDURES if m == 1 else VECTOR_PROCEDURES
    rows = _run_draws(pop, ks, k_pop, tau, cal, cov, limits, procs, progress)
    draws = _at_population(pop, rows, names, tau, cov.bon_n, limits)
    at_ref = population_at(pop, np.array([np.zeros(m)] + ([lam_pop] if lam_pop is not None else [])), cov.bon_n,
                           limits)
    reward_pop = float(at_ref[1, 2 * m]) if lam_pop is not None else None
    promised = promises(m, cal)
    summary = [_summary_row(g, proc, names, tau, cal, reward_pop)
               for (_, _, proc), g in draws.groupby(["k", "n", "procedure"], sort=True)]
    order = {p: i for i, p in enumerate(procs)}
    summary.sort(key=lambda r: (r["k"], order[r["procedure"]], r["n"]))
    for proc, p in promised.items():  # consistent at every size (None: no promise to check)
        flags = [r["promise_consistent"] for r in summary if r["procedure"] == proc]
        p["consistent"] = None if any(f is None for f in flags) else all(flags)
    status = "infeasible" if lam_pop is None else ("inactive" if ref["s"] == 0 else "interior")
    population = {
        "n_prompts": int(pop.n_prompts), "samples_per_prompt": k_pop, "bon_n": cov.bon_n, "lambda_pop": lam_pop,
        "lambda_pop_status": status, "direction": ref["direction"], "s": ref["s"], "soft": ref["soft"],
        "soft_converged": bool(ref["solve"]["converged"]), "cost_at_zero": at_ref[0, :m].tolist(),
        "reward_at_zero": float(at_ref[0, 2 * m]),
        "cost_at_lambda_pop": None if lam_pop is None else at_ref[1, :m].tolist(), "reward_at_lambda_pop": reward_pop,
        "clipped_fraction": clipped_fraction}
    return {"population": population, "names": names, "tau": tau.tolist(), "procedures": list(procs),
            "deployed": cal.guarantee, "promises": promised, "summary": summary,
            "wall_s": time.perf_counter() - t0}, draws


def load_population(paths, constraints):
    """The constraint-score tables as one population (each checked by :func:`lara.constraints.calibrate.
    load_vector_scores`, errors naming the file), refusing a prompt found in two of them."""
    from lara import identity
    from lara.constraints.calibrate import VectorScores, load_vector_scores

    identity.distinct_files(paths, "--scores")
    parts = [load_vector_scores(p, constraints, "--scores") for p in paths]
    pop = VectorScores(*population(parts, paths, "costs"))
    identity.distinct_pools({str(p): part.prompts for p, part in zip(paths, parts, strict=True)})
    return pop


# ---------------------------------------------------------------------------------------------
# CLI: lara coverage-vector


def add_arguments(parser) -> None:
    parser.add_argument("--scores", nargs="+", required=True,
                        help="constraint-score tables (prompt_id, reward, cost_<name>; lara score-constraints); "
                             "their prompts together are the population")
    parser.add_argument("--constraints", required=True, help="JSON list of the constraints (calibration.constraints)")
    parser.add_argument("--calibration-settings", required=True,
                        help="JSON of the calibration's settings (the calibration section, as `lara calibrate-vector "
                             "--settings` takes it)")
    add_settings_arguments(parser, CoverageSettings, section_help="JSON of the study's settings (the coverage "
                                                                  "section, as `lara coverage --settings` takes it)")
    parser.add_argument("--out", required=True, help="the study's record (JSON): population, promises, summary")
    parser.add_argument("--table", required=True, help="the summary as CSV, one row per procedure, K and n")


def run(args) -> None:
    from lara.calibrate.record import provenance
    from lara.constraints.spec import from_arg
    from lara.io import write_json
    from lara.read.files import DataError, write_table
    from lara.settings import nonfinite

    cov = read_settings(args, CoverageSettings)
    cal = CalibrationSettings.from_json(args.calibration_settings, origin="--calibration-settings")
    constraints = from_arg(args.constraints)
    check_settings(cal, cov, len(constraints))
    pop = load_population(args.scores, constraints)
    counts = pop.mask.sum(axis=1)
    log.info("population: %d prompts (K %d to %d), %d constraints %s, tau %s, from %s; settings %s; calibration %s",
             pop.n_prompts, int(counts.min()), int(counts.max()), len(constraints), [c.name for c in constraints],
             [c.tau for c in constraints], ", ".join(args.scores), cov, cal)

    try:
        result, _ = study(pop, constraints, cal, cov, log_progress)
    except ValueError as exc:
        raise DataError(f"--scores {', '.join(map(str, args.scores))}: {exc}") from None
    p = result["population"]
    log.info("population lambda_pop %s (%s, direction %s): cost %s -> %s, reward %.4f -> %s (lambda 0 -> lambda_pop)",
             p["lambda_pop"], p["lambda_pop_status"], p["direction"], p["cost_at_zero"], p["cost_at_lambda_pop"],
             p["reward_at_zero"], p["reward_at_lambda_pop"])
    for r in result["summary"]:
        per = ", ".join(f"{n} {r[f'violation_rate_{n}']:.3f}" for n in result["names"])
        log.info("%-9s n %4d K %3d: joint violation %.3f [%.3f, %.3f] (%s), not feasible %.3f, mean cost %s, "
                 "reward %.4f, consistent with its promise: %s", r["procedure"], r["n"], r["k"], r["violation_rate"],
                 r["violation_lo"], r["violation_hi"], per, r["infeasible_rate"],
                 [round(r[f"mean_population_cost_{n}"], 4) for n in result["names"]], r["mean_reward"],
                 r["promise_consistent"])
    for proc, promise in result["promises"].items():
        log.info("%s: promise %s; consistent: %s", proc, promise["promise"], promise["consistent"])
    result |= provenance(cov, args.scores, constraints=[asdict(c) for c in constraints],
                         calibration_settings=asdict(cal))
    bad = nonfinite({k: v for k, v in result.items() if k not in ("settings", "calibration_settings")})
    if bad:
        raise DataError(f"{args.out}: refusing to write a record whose {', '.join(bad)} is not finite")
    write_table(pd.DataFrame(result["summary"]), args.table)
    write_json(args.out, result)
