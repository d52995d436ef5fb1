"""``lara coverage``: how often each calibration procedure's lambda misses tau, measured, and what a sample
size buys (calibration sample-size planning).

    lara coverage --scores calibration/scores.parquet bon/scores.parquet --settings '{...}' \\
        --out coverage.json --table coverage.csv

The scored tables (one row per response: prompt_id, reward, cost; the prompts of all tables together)
are the **population**: each of its prompts with its K scored samples, and the Best-of-N decoder drawing
N of them at random. Everything about it is exact: its mean Best-of-N cost and reward at any lambda (the
rank weights of :mod:`lara.calibrate.bestofn`), and lambda_pop, the smallest lambda whose population mean
cost is <= tau. The study repeats ``repeats`` times, for each calibration size n (and each K of
``samples_per_prompt``, K >= N): draw n prompts i.i.d. from the population (K of each one's samples
without replacement), calibrate with each procedure (the bootstrap's quantile of ``bootstrap``
replicates, CRC, LTT at delta; :mod:`lara.calibrate.certify`) and evaluate the chosen lambda on the
whole population. Per procedure and size: the violation rate (population mean cost > tau) with its
Clopper-Pearson 95 % interval, the mean population cost (CRC promises this mean <= tau for the clipped
cost), the mean reward, the reward given up against lambda_pop, and the 2.5-97.5 % band of the chosen
lambda over draws (how far a recalibration on fresh prompts would move it).

The population is finite and the draws are i.i.d. from it, so each procedure's promise applies to it
exactly: LTT's violation rate must be <= delta (up to the binomial interval), CRC's mean clipped cost
<= tau. How close the population is to the real prompt distribution is a separate question: the study
reports its size.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd

from lara.calibrate.certify import CERTIFIED, PROCEDURES, certified_lambda, clip_costs, clipped_steps
from lara.calibrate.dual import PromptScores
from lara.calibrate.procedures import CoverageCalibration
from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting
from lara.stats import clopper_pearson

log = logging.getLogger(__name__)

HELP = "coverage study of the calibration procedures (bootstrap, CRC, LTT) on a scored population"
OUTPUTS = ("out", "table")


@dataclass(frozen=True)
class CoverageSettings(CoverageCalibration, Settings):
    """coverage: the repeated-calibration study of lara.calibrate.coverage."""

    SECTION: ClassVar[str] = "coverage"

    bon_n: int = setting(help="The Best-of-N size calibrated for.", minimum=1, key="decode.bon_n")
    repeats: int = setting(200, "Calibration draws per size (the violation rate's binomial interval narrows as "
                                "1/sqrt(repeats)).", minimum=1)
    n_prompts: list[int] = setting([50, 100, 200], "Calibration sizes n (prompts per draw, i.i.d. from the "
                                                   "population).", minimum=1)
    samples_per_prompt: list[int] | None = setting(
        None, "Samples per prompt K of each draw, for sample-size planning (each >= decode.bon_n and <= the "
              "population's K; null: all of them).", minimum=1)
    bootstrap: int = setting(1000, "Bootstrap replicates of the bootstrap procedure inside each draw (the deployed "
                                   "calibration uses calibration.bootstrap).", minimum=1)
    seed: int = seed_setting()


def population_curves(pop: PromptScores, n: int, lams: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """(3, L): the population's mean Best-of-n cost, clipped cost and reward at each lambda (exact)."""
    from lara.calibrate.bestofn import expected

    lams = np.asarray(lams, dtype=float)
    return np.concatenate([expected(pop.reward, pop.cost, pop.mask, lams[lo:lo + 64], n, pop.cost, clip,
                                    pop.reward).mean(axis=1) for lo in range(0, len(lams), 64)], axis=1)


def draw(pop, rng: np.random.Generator, n: int, k: int | None, costs: str = "cost") -> tuple[np.ndarray, object]:
    """n prompts i.i.d. from the population (their indices), each with k of its samples drawn without
    replacement (k None: all of them, and no table: the draw is a weighting of the population's prompts); ``costs``:
    the population's field of costs (``cost`` (P, K) of a :class:`PromptScores`, or ``costs`` (P, K, m) of the
    constraints' scores: the same random numbers draw the same prompts and samples)."""
    idx = rng.integers(0, pop.n_prompts, size=n)
    if k is None:
        return idx, None
    m = pop.mask[idx]
    keys = np.where(m, rng.random(m.shape), np.inf)  # real samples in random order, padding last
    cols = np.argsort(keys, axis=1)[:, :k]

    def take(a):
        return np.take_along_axis(a[idx], cols.reshape(cols.shape + (1,) * (a.ndim - 2)), 1)

    return idx, type(pop)(take(pop.reward), take(getattr(pop, costs)), take(pop.mask), pop.prompt_ids[idx])


def sample_sizes(k_pop: int, s) -> list:
    """The K of each draw (None: all of a prompt's samples) of the coverage settings ``s``, each checked against
    decode.bon_n and the population's K ``k_pop``."""
    if s.bon_n > k_pop:
        raise ValueError(f"decode.bon_n = {s.bon_n} but a population prompt has only K = {k_pop} samples")
    ks = [None] if s.samples_per_prompt is None else sorted(set(s.samples_per_prompt))
    bad = [k for k in ks if k is not None and not s.bon_n <= k <= k_pop]
    if bad:
        raise ValueError(f"coverage.samples_per_prompt {bad}: each K must lie in [decode.bon_n = {s.bon_n}, the "
                         f"population's K = {k_pop}]")
    return ks


def repeat_draws(ks: list, k_pop: int, s, one, progress=None) -> list[dict]:
    """Every draw (K, n, repeat) of the coverage settings ``s`` calibrated by ``one(n, k)`` (each procedure's
    (lambda, feasible) on a fresh draw), as rows; ``progress(done, total, elapsed)`` every 5 % of the draws."""
    sizes = sorted(set(s.n_prompts))
    rows = []
    total, done, t0 = len(ks) * len(sizes) * s.repeats, 0, time.perf_counter()
    for k in ks:
        for n in sizes:
            for rep in range(s.repeats):
                rows += [{"k": k or k_pop, "n": n, "repeat": rep, "procedure": p, "lambda": lam, "feasible": ok}
                         for p, (lam, ok) in one(n, k).items()]
                done += 1
                if progress and (done % max(1, total // 20) == 0 or done == total):
                    progress(done, total, time.perf_counter() - t0)
    return rows


def log_progress(done: int, total: int, elapsed: float) -> None:
    """A coverage study's progress, logged."""
    log.info("draw %d/%d (%.1f s, ETA %.0f s)", done, total, elapsed, elapsed / done * (total - done))


def violation_summary(g: pd.DataFrame) -> dict:
    """A group of draws' size and its violation rate (column ``violated``) with its Clopper-Pearson 95 % interval."""
    v = int(g["violated"].sum())
    lo, hi = clopper_pearson(v, len(g))
    return {"repeats": len(g), "violation_rate": v / len(g), "violation_lo": lo, "violation_hi": hi}


def lambda_band(lam: pd.Series, suffix: str = "") -> dict:
    """The mean of a group of draws' lambdas and their 2.5-97.5 % band."""
    return {f"lambda_mean{suffix}": float(lam.mean()), f"lambda_lo{suffix}": float(lam.quantile(0.025)),
            f"lambda_hi{suffix}": float(lam.quantile(0.975))}


def population(parts: list, paths, costs: str = "cost") -> tuple:
    """The population of several tables' scores (reward, ``costs``, mask, prompt ids): each padded to the widest K
    (padding masked out); a prompt_id found in two tables is refused, naming them."""
    from lara.read.files import DataError

    ids = np.concatenate([p.prompt_ids for p in parts])
    if len(np.unique(ids)) != len(ids):
        raise DataError(f"--scores {', '.join(map(str, paths))}: a prompt_id appears in two tables; the "
                        "population's prompts must be distinct")
    kmax = max(p.reward.shape[1] for p in parts)

    def pad(a, fill):
        return np.pad(a, [(0, 0), (0, kmax - a.shape[1])] + [(0, 0)] * (a.ndim - 2), constant_values=fill)

    return (np.concatenate([pad(p.reward, 0.0) for p in parts]),
            np.concatenate([pad(getattr(p, costs), 0.0) for p in parts]),
            np.concatenate([pad(p.mask, False) for p in parts]), ids)


@dataclass(frozen=True)
class Curves:
    """The steps of the Best-of-N expected cost of a set of prompts, unclipped and clipped."""

    cost: object  # lara.calibrate.bestofn.Steps
    clipped: object

    @classmethod
    def of(cls, sub: PromptScores, s: CoverageSettings) -> Curves:
        from lara.calibrate.bestofn import steps

        cost = steps(sub.reward, sub.cost, sub.mask, s.bon_n, s.lambda_search_max)
        return cls(cost, clipped_steps(sub, s.bon_n, s.lambda_search_max, s.cost_bounds, cost))


def calibrate_draw(pop: PromptScores, whole: Curves, n: int, k: int | None, s: CoverageSettings,
                   rng: np.random.Generator, hat: bool = False) -> dict:
    """Each procedure's lambda (and whether it reached tau) on a fresh draw (:func:`draw`) of n prompts of ``pop``
    with k samples each (their own curves; k None: all of them, the draw a weighting of the population's curves
    ``whole``). The same computation as ``lara calibrate`` (exact roots of the weighted mean; the bootstrap resamples
    the drawn prompts), with the drawn prompts as weights; ``hat``: with lambda-hat first (the exact root of the
    draw's mean expected Best-of-N cost)."""
    from lara.calibrate.bestofn import roots

    idx, sub = draw(pop, rng, n, k)
    curves, rows = (whole, idx) if sub is None else (Curves.of(sub, s), np.arange(n))
    p = len(curves.cost.start)
    w = np.bincount(rows, minlength=p)[None, :] / n
    out = {}
    if hat:
        lam, status = roots(curves.cost, w, s.tau, s.lambda_search_max)
        out["hat"] = (float(lam[0]), bool(status[0] != 2))
    boot = rows[rng.integers(0, n, size=(s.bootstrap, n))]
    wb = np.stack([np.bincount(b, minlength=p) for b in boot]) / n
    lams, status = roots(curves.cost, wb, s.tau, s.lambda_search_max)
    # the bootstrap's lambda* is infeasible when its quantile lands on replicates that never reach tau
    out["bootstrap"] = (float(np.quantile(lams, s.quantile)), bool((status == 2).mean() <= 1 - s.quantile))
    for proc in CERTIFIED:  # (the draw is i.i.d., so its own order is the betting test's: ``rows``)
        c = certified_lambda(curves.clipped, n, proc, s.tau, s.lambda_search_max, s.cost_bounds, s.delta, weights=w,
                             rows=rows)
        out[proc] = (c.lam, c.feasible)
    return out


def study(pop: PromptScores, s: CoverageSettings, progress=None) -> tuple[dict, pd.DataFrame]:
    """The coverage study of the module docstring: its record (population, promises, the summary per procedure,
    size and K) and the per-draw rows."""
    from lara.calibrate.bestofn import roots

    k_pop = int(pop.counts.min())
    ks = sample_sizes(k_pop, s)
    clip, frac = clip_costs(pop.cost, pop.mask, s.cost_bounds)
    whole = Curves.of(pop, s)  # every draw of whole prompts is a weighting of these
    lam_pop, status = roots(whole.cost, np.full((1, pop.n_prompts), 1.0 / pop.n_prompts), s.tau, s.lambda_search_max)
    lam_pop = float(lam_pop[0])
    pop_at = population_curves(pop, s.bon_n, [0.0, lam_pop], clip)
    rng = np.random.default_rng([s.seed, 27])
    t0 = time.perf_counter()

    rows = repeat_draws(ks, k_pop, s, lambda n, k: calibrate_draw(pop, whole, n, k, s, rng), progress)
    draws = pd.DataFrame(rows)
    uniq, inv = np.unique(draws["lambda"].to_numpy(), return_inverse=True)
    curves = population_curves(pop, s.bon_n, uniq, clip)
    draws["population_cost"], draws["population_clipped_cost"], draws["population_reward"] = curves[:, inv]
    draws["violated"] = draws["population_cost"] > s.tau
    summary = []
    for (k, n, proc), g in draws.groupby(["k", "n", "procedure"], sort=True):
        summary.append({
            "procedure": proc, "n": int(n), "k": int(k), **violation_summary(g),
            "mean_population_cost": float(g["population_cost"].mean()),
            "mean_population_clipped_cost": float(g["population_clipped_cost"].mean()),
            "mean_reward": float(g["population_reward"].mean()),
            "reward_given_up": float(pop_at[2, 1] - g["population_reward"].mean()),
            **lambda_band(g["lambda"]), "infeasible_rate": float(1 - g["feasible"].mean())})
    order = {p: i for i, p in enumerate(PROCEDURES)}
    summary.sort(key=lambda r: (r["k"], order[r["procedure"]], r["n"]))
    return {
        "population": {"n_prompts": pop.n_prompts, "samples_per_prompt": k_pop, "bon_n": s.bon_n,
                       "lambda_pop": lam_pop, "lambda_pop_status": ("interior", "inactive", "infeasible")[status[0]],
                       "cost_at_zero": float(pop_at[0, 0]), "reward_at_zero": float(pop_at[2, 0]),
                       "cost_at_lambda_pop": float(pop_at[0, 1]), "reward_at_lambda_pop": float(pop_at[2, 1]),
                       "clipped_fraction": frac},
        "promises": {"bootstrap": f"none (nominal: the {s.quantile:g} quantile)",
                     "crc": "mean over draws of the population's clipped cost <= tau",
                     "ltt": f"violation rate <= delta = {s.delta:g}",
                     "ltt_wsr": f"violation rate <= delta = {s.delta:g}"},
        "summary": summary, "wall_s": time.perf_counter() - t0}, draws


# ---------------------------------------------------------------------------------------------
# CLI: lara coverage


def add_arguments(parser) -> None:
    parser.add_argument("--scores", nargs="+", required=True,
                        help="scored tables (prompt_id, reward, cost); their prompts together are the population")
    add_settings_arguments(parser, CoverageSettings)
    parser.add_argument("--out", required=True, help="coverage.json: the population, the settings and the summary")
    parser.add_argument("--table", required=True, help="the summary as CSV, one row per procedure, K and n")


def run(args) -> None:
    from lara import identity
    from lara.calibrate.calibrate import load_scores
    from lara.calibrate.procedures import check_sizes
    from lara.calibrate.record import provenance
    from lara.io import write_json
    from lara.read.files import DataError, write_table

    s = read_settings(args, CoverageSettings)
    if s.cost_bounds is None:
        from lara.config import ConfigError

        raise ConfigError("calibration.cost_bounds: the coverage study compares CRC and LTT with the bootstrap; they "
                          "need fixed cost bounds [lo, hi]")
    check_sizes(s.n_prompts)
    sets = []
    pop = PromptScores(*population([load_scores(p, sets) for p in args.scores], args.scores))
    identity.distinct_pools(dict(zip(map(str, args.scores), sets, strict=True)))
    log.info("population: %d prompts (K %d to %d) from %s; settings %s", pop.n_prompts, int(pop.counts.min()),
             int(pop.counts.max()), ", ".join(args.scores), s)
    try:
        result, _ = study(pop, s, log_progress)
    except ValueError as exc:
        raise DataError(f"{', '.join(args.scores)}: {exc}") from None
    p = result["population"]
    log.info("population lambda_pop %.6g (%s): cost %.4f -> %.4f, reward %.4f -> %.4f (lambda 0 -> lambda_pop)",
             p["lambda_pop"], p["lambda_pop_status"], p["cost_at_zero"], p["cost_at_lambda_pop"], p["reward_at_zero"],
             p["reward_at_lambda_pop"])
    for r in result["summary"]:
        log.info("%-9s n %4d K %3d: violation %.3f [%.3f, %.3f], cost %.4f, reward given up %.4f, lambda %.4g "
                 "[%.4g, %.4g]", r["procedure"], r["n"], r["k"], r["violation_rate"], r["violation_lo"],
                 r["violation_hi"], r["mean_population_cost"], r["reward_given_up"], r["lambda_mean"], r["lambda_lo"],
                 r["lambda_hi"])
    result |= provenance(s, args.scores, tau=s.tau)
    write_table(pd.DataFrame(result["summary"]), args.table)
    write_json(args.out, result)
