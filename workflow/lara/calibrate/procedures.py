"""The calibration procedures over any decoder on a lambda grid (:mod:`lara.calibrate.decoder`), written once: the
searches, the record with a statement per procedure, the coverage study, and the checks a record must pass before a
decoder is run at one of its lambdas. Pure numpy; no I/O.

**Searches.** A decoder's cost need not be monotone in lambda (pruned Best-of-N's is not), so every search takes the
*stable* root: the smallest grid lambda from which on, up to Lambda, the constraint holds (for a monotone curve the
ordinary root). So:

* lambda-hat: the stable root of the calibration mean; lambda*: the ``quantile`` of its prompt bootstrap;
* LTT (Hoeffding-Bentkus or betting p-values): fixed-sequence testing from Lambda down the grid, stopped at the
  first lambda not rejected. Fixed-sequence testing controls the error for any fixed order, monotone or not,
  so P(E[loss(lam_ltt)] <= tau) >= 1 - delta over the calibration draw;
* CRC needs a non-increasing loss: it is applied to each prompt's upper envelope max_{mu >= lam} loss(mu)
  (non-increasing, never below the loss), so its statement holds for the decoder's own loss, conservatively.

**One record.** :func:`calibrate` states every procedure with its promise, the share of calibration costs the bounds
clip, how the loss averages over subsets (and the sampled estimate's error), and whether it certified a lambda; the
floors (prompts, bootstrap replicates, sampled subsets, clipped share) and the identity comparisons of a record with
the decoder that reads it (:func:`check_record`) are made here for every decoder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np

from lara.calibrate.certify import PROCEDURES
from lara.calibrate.decoder import MIN_PROMPTS, MIN_SAMPLED_SUBSETS, Curves, clipped_share, subset_statement
from lara.data.errors import DataError
from lara.settings import CERTIFIED, COST_RESOLUTION, cross_key, ordered_bounds, setting

QUANTILES = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.975)
STATUS = {0: "interior", 1: "inactive", 2: "infeasible"}  # the words of the exact calibration's record
MAX_CLIPPED = 0.01  # the largest share of calibration costs the bounds may clip for a deployed certificate


class CalibrationRules:
    """The cross-key rules of every settings class that calibrates a decoder from the calibration section's keys
    (tau, bootstrap, quantile, guarantee, cost_bounds): written once, inherited by each."""

    @cross_key("calibration.cost_bounds", witness={"calibration": {"cost_bounds": [1.0, -1.0]}})
    def bounds_ordered(self):
        return ordered_bounds(self.cost_bounds, "calibration.cost_bounds")

    @cross_key("calibration.guarantee", "calibration.cost_bounds",
               witness={"calibration": {"guarantee": "ltt", "cost_bounds": None}})
    def guarantee_bounded(self):
        if self.guarantee != "bootstrap" and self.cost_bounds is None:
            return (f"calibration.guarantee: {self.guarantee} needs calibration.cost_bounds ([lo, hi], fixed before "
                    "the calibration samples are seen): its guarantee holds for a bounded cost")

    @cross_key("calibration.tau", witness={"calibration": {"tau": 1e-9}})
    def tau_resolved(self):
        if self.tau != 0 and abs(self.tau) < COST_RESOLUTION:
            return (f"calibration.tau: {self.tau:g} is within {COST_RESOLUTION:g} of 0, below the resolution the "
                    "calibration compares costs with; rescale the costs and tau")

    @cross_key("calibration.bootstrap", "calibration.quantile",
               witness={"calibration": {"bootstrap": 100, "quantile": 0.975}})
    def bootstrap_resolves(self):
        from lara.stats import quantile_replicates_problem

        problem = quantile_replicates_problem(self.bootstrap, self.quantile, "calibration.bootstrap", "the deployed")
        return f"{problem} (nothing was computed)" if problem else None


@dataclass(frozen=True)
class GridCalibration(CalibrationRules):
    """The calibration section's keys every decoder calibrated on a grid reads (borrowed: one value, the calibration
    section's), with their rules."""

    tau: float = setting(help="The cost budget.", key="calibration.tau")
    lambda_search_max: float = setting(help="The end of the search interval.", exclusive_minimum=0,
                                       key="calibration.lambda_search_max")
    bootstrap: int = setting(help="Bootstrap replicates over prompts.", minimum=1, key="calibration.bootstrap")
    quantile: float = setting(help="Bootstrap quantile deployed as lambda*.", exclusive_minimum=0,
                              exclusive_maximum=1, key="calibration.quantile")
    guarantee: Literal["bootstrap", "crc", "ltt", "ltt_wsr"] = setting(
        help="The procedure whose lambda is deployed as lambda*.", key="calibration.guarantee")
    delta: float = setting(help="LTT's error probability.", exclusive_minimum=0, exclusive_maximum=1,
                           key="calibration.delta")
    cost_bounds: list[float] | None = setting(help="[lo, hi] the certificates clip the cost to.", length=2,
                                              key="calibration.cost_bounds")


class CoverageRules:
    """The cross-key rules of every coverage study's settings (coverage.*, with the calibration's bounds and
    quantile): written once, inherited by each."""

    @cross_key("calibration.cost_bounds", witness={"calibration": {"cost_bounds": [2.0, 2.0]}})
    def bounds_ordered(self):
        return ordered_bounds(self.cost_bounds, "calibration.cost_bounds")

    @cross_key("coverage.bootstrap", "calibration.quantile", witness={"coverage": {"bootstrap": 100}})
    def bootstrap_resolves(self):
        from lara.stats import quantile_replicates_problem

        return quantile_replicates_problem(self.bootstrap, self.quantile, "coverage.bootstrap",
                                           "each draw's bootstrap procedure's")


@dataclass(frozen=True)
class CoverageCalibration(CoverageRules):
    """The calibration section's keys every coverage study reads (borrowed: the deployed calibration's values), with
    the coverage rules."""

    tau: float = setting(help="The cost budget (the first listed one).", key="calibration.tau")
    quantile: float = setting(help="The bootstrap procedure's quantile.", exclusive_minimum=0, exclusive_maximum=1,
                              key="calibration.quantile")
    delta: float = setting(help="LTT's delta.", exclusive_minimum=0, exclusive_maximum=1, key="calibration.delta")
    cost_bounds: list[float] | None = setting(help="CRC and LTT's cost bounds (a coverage study needs them).",
                                              length=2, key="calibration.cost_bounds")
    lambda_search_max: float = setting(help="The search interval's end.", exclusive_minimum=0,
                                       key="calibration.lambda_search_max")


# ---------------------------------------------------------------------------------------------
# Searches on the grid


def stable_root(ok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows of ``ok`` (B, L) over an increasing grid: the index of the smallest grid point from which on
    every point is ok, and a status (0 found, 1 inactive: every point ok, from lam = 0; 2 infeasible: the
    last point is not ok, index L - 1 reported)."""
    ok = np.atleast_2d(ok)
    b, n_lam = ok.shape
    bad = ~ok
    any_bad = bad.any(axis=1)
    last_bad = n_lam - 1 - np.argmax(bad[:, ::-1], axis=1)
    idx = np.where(any_bad, last_bad + 1, 0)
    status = np.where(any_bad, 0, 1).astype(np.int8)
    infeasible = idx >= n_lam
    status[infeasible] = 2
    idx = np.minimum(idx, n_lam - 1)
    return idx, status


def _slack(tau: float) -> float:
    return 1e-12 * max(1.0, abs(tau))


def bootstrap_roots(v: np.ndarray, tau: float, replicates: int, seed: int,
                    block: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """The stable root's grid index and status (:func:`stable_root`) of ``replicates`` prompt-bootstrap replicates
    of the mean curve of ``v`` (P, L); an infeasible replicate at the last index."""
    p = v.shape[0]
    rng = np.random.default_rng(seed)
    out = np.empty(replicates, dtype=np.int64)
    status = np.empty(replicates, dtype=np.int8)
    for b0 in range(0, replicates, block):
        m = min(block, replicates - b0)
        w = rng.multinomial(p, np.full(p, 1.0 / p), size=m) / p
        out[b0:b0 + m], status[b0:b0 + m] = stable_root((w @ v) <= tau + _slack(tau))
    return out, status


def envelope(v: np.ndarray) -> np.ndarray:
    """Per row (P, L) the upper envelope max_{mu >= lam} v(mu): non-increasing in lam, never below v."""
    return np.maximum.accumulate(v[:, ::-1], axis=1)[:, ::-1]


@dataclass(frozen=True)
class Search:
    index: int
    status: int  # 0 found, 1 inactive, 2 infeasible

    def lam(self, grid) -> float:
        return float(grid[self.index])

    @property
    def feasible(self) -> bool:
        return self.status != 2


def hat(c: Curves, tau: float) -> Search:
    idx, st = stable_root(c.cost.mean(axis=0)[None] <= tau + _slack(tau))
    return Search(int(idx[0]), int(st[0]))


def crc(c: Curves, tau: float, bounds) -> Search:
    from lara.calibrate.certify import crc_threshold

    thr = crc_threshold(tau, c.clipped.shape[0], bounds)
    idx, st = stable_root(envelope(c.clipped).mean(axis=0)[None] <= thr + _slack(thr))
    return Search(int(idx[0]), int(st[0]))


def ltt(c: Curves, tau: float, delta: float, bounds, p_values: str = "hb", seed: int = 0) -> Search:
    """Fixed-sequence Learn then Test from the top of the grid down (module docstring)."""
    n = c.clipped.shape[0]
    if p_values == "hb":
        from lara.calibrate.certify import ltt_threshold

        thr = ltt_threshold(tau, n, delta, bounds)
        if thr is None:
            return Search(len(c.grid) - 1, 2)
        rejected = c.clipped.mean(axis=0) <= thr
    elif p_values == "wsr":
        from lara.calibrate.betting import betting_p_values, prompt_order

        rejected = betting_p_values(c.clipped.T, tau, delta, bounds, prompt_order(n, seed)) <= delta
    else:
        raise ValueError(f"p_values: hb or wsr, got {p_values!r}")
    idx, st = stable_root(rejected[None])
    return Search(int(idx[0]), int(st[0]))


def searches(c: Curves, s, seed: int, boot_idx: np.ndarray | None = None, hat_search: Search | None = None) -> dict:
    """Every procedure's search on ``c``: the bootstrap's quantile (of ``boot_idx``, the replicates' roots) and,
    with cost bounds, CRC, LTT and LTT-WSR."""
    hat_search = hat_search or hat(c, s.tau)
    star = int(np.quantile(boot_idx, s.quantile, method="higher"))
    out = {"bootstrap": Search(star, 0 if hat_search.feasible else 2)}
    if s.cost_bounds is not None:
        out |= {"crc": crc(c, s.tau, s.cost_bounds), "ltt": ltt(c, s.tau, s.delta, s.cost_bounds, "hb"),
                "ltt_wsr": ltt(c, s.tau, s.delta, s.cost_bounds, "wsr", seed)}
    return out


# ---------------------------------------------------------------------------------------------
# The record


def statement(procedure: str, lam: float, s, decoder, c: Curves, feasible: bool, clipped: dict | None) -> str:
    """The guarantee of one procedure's lambda for ``decoder``, in one sentence (the one writer of every decoder's
    statements, :func:`lara.calibrate.certify.statement`), with the share of costs its bounds clip and how the loss
    was searched and averaged over subsets."""
    from lara.calibrate.certify import statement as one_statement

    draws = subset_statement(c, decoder.identity()["n"])
    how = {"crc": f"; on each prompt's upper envelope over lambda, which makes it monotone; losses {draws}",
           "bootstrap": f"; a grid point, rounded up; losses {draws}"}.get(
        procedure, f", down a {len(c.grid)}-point grid, valid without monotonicity; losses {draws}")
    return one_statement(procedure, lam=lam, tau=s.tau, n_prompts=c.n_prompts, bon_n=None, feasible=feasible,
                         delta=s.delta, bounds=s.cost_bounds if procedure != "bootstrap" else None,
                         quantile=s.quantile, replicates=s.bootstrap,
                         clipped=None if clipped is None else clipped["below"] + clipped["above"],
                         decoder=decoder.describe(), how=how)


def check_floors(n_prompts: int, k: int, c: Curves | None, decoder, where: str) -> None:
    """What every calibration needs of its data, for every decoder: two prompts or more (the bootstrap resamples
    prompts), K >= N samples per prompt, and a sampled (not exact) subset estimate of at least two subsets (one
    states no standard error)."""
    n = decoder.identity()["n"]
    if n_prompts < MIN_PROMPTS:
        raise DataError(f"{where}: {n_prompts} calibration prompt(s), fewer than {MIN_PROMPTS} (the bootstrap "
                        "resamples prompts): no lambda* is stated")
    if k < n:
        raise DataError(f"{where}: K = {k} samples per prompt, fewer than the decoder's N = {n} (decode.bon_n)")
    if c is not None and not c.exact and c.n_subsets < MIN_SAMPLED_SUBSETS:
        raise DataError(f"{where}: {c.n_subsets} sampled {n}-subset per prompt: a sampled estimate needs at least "
                        f"{MIN_SAMPLED_SUBSETS} to state its standard error (raise decode.bon_prune.max_subsets)")


def calibrate(decoder, s, cost: np.ndarray, where: str) -> dict:
    """The record's content for ``decoder`` (everything but settings, inputs and identity): every procedure's
    lambda with its statement and calibration means; ``cost``: the calibration samples' costs (P, K): the floors
    and the clipped share."""
    import time

    check_floors(cost.shape[0], cost.shape[1], None, decoder, where)
    t0 = time.perf_counter()
    grid = np.linspace(0.0, s.lambda_search_max, s.grid_points)
    c = decoder.curves(grid, s.cost_bounds)
    check_floors(cost.shape[0], cost.shape[1], c, decoder, where)
    t1 = time.perf_counter()
    h = hat(c, s.tau)
    boot_idx, boot_status = bootstrap_roots(c.cost, s.tau, s.bootstrap, s.seed)
    boot = grid[boot_idx]
    t2 = time.perf_counter()
    found = searches(c, s, s.seed, boot_idx, h)
    t3 = time.perf_counter()
    clipped = clipped_share(cost, s.cost_bounds)
    procedures = {}
    for name, search in found.items():
        p = {"lambda": search.lam(grid), "feasible": search.feasible}
        p["statement"] = statement(name, p["lambda"], s, decoder, c, p["feasible"], clipped)
        procedures[name] = p | c.at(search.index)
    deployed = procedures[s.guarantee]
    full_tokens = decoder.full_tokens()
    quantiles = {str(q): float(grid[int(np.quantile(boot_idx, q, method="higher"))])
                 for q in sorted({*QUANTILES, s.quantile})}
    return {
        "lambda_hat": h.lam(grid),
        "lambda_star": deployed["lambda"],
        "guarantee": {"procedure": s.guarantee, "delta": s.delta if s.guarantee in ("ltt", "ltt_wsr") else None,
                      "cost_bounds": s.cost_bounds, "clipped_fraction": clipped, "feasible": deployed["feasible"],
                      "statement": deployed["statement"]},
        "procedures": procedures,
        "decoder": decoder.identity(),
        "decoder_cost_at_lambda_hat": float(c.cost[:, h.index].mean()),
        "decoder_cost_at_lambda_star": deployed["mean_cost"],
        "status": STATUS[h.status],
        "feasible": h.feasible and deployed["feasible"],
        "subsets": {"exact": c.exact, "count": c.n_subsets, "max_standard_error": float(c.cost_se.mean(axis=0).max())},
        "tokens": {"full_best_of_n": full_tokens, "at_lambda_star": deployed["mean_tokens"],
                   "ratio_at_lambda_star": full_tokens / deployed["mean_tokens"]},
        "bootstrap": bootstrap_summary(boot, boot_status, s, quantiles),
        "tau": s.tau,
        "lambda_search_max": s.lambda_search_max,
        "mode": decoder.mode,
        "seed": s.seed,
        "n_prompts": c.n_prompts,
        "samples_per_prompt": {"min": int(cost.shape[1]), "max": int(cost.shape[1]), "mean": float(cost.shape[1]),
                               "total": int(cost.size)},
        "monotone": c.monotone,
        "curves": {"lambda": grid.tolist(), "mean_cost": c.cost.mean(axis=0).tolist(),
                   "mean_reward": c.reward.mean(axis=0).tolist(), "mean_tokens": c.tokens.mean(axis=0).tolist()},
        "timing_s": {"curves": t1 - t0, "bootstrap": t2 - t1, "certified": t3 - t2},
        **decoder.facts(deployed["lambda"]),
    }


def bootstrap_summary(lams: np.ndarray, status: np.ndarray, s, quantiles: dict) -> dict:
    """The record's summary of the bootstrap replicates ``lams`` of lambda-hat (``status``: each one's, 1 inactive, 2
    infeasible) with their ``quantiles`` (the deployed one among them, so a reader can check lambda_star against it,
    :mod:`lara.calibrate.record`)."""
    hist, edges = np.histogram(lams, bins=50)
    return {"replicates": s.bootstrap, "quantile": s.quantile, "mean": float(lams.mean()),
            "std": float(lams.std(ddof=1)) if len(lams) > 1 else 0.0, "quantiles": quantiles,
            "n_inactive": int((status == 1).sum()), "n_infeasible": int((status == 2).sum()),
            "histogram": {"counts": hist.tolist(), "edges": edges.tolist()}}


def check_sizes(n_prompts) -> None:
    """A coverage study's calibration sizes: at least one, each of at least MIN_PROMPTS prompts (each draw's
    bootstrap resamples prompts)."""
    from lara.settings import ConfigError

    if not n_prompts:
        raise ConfigError("coverage.n_prompts is empty: no calibration size to study")
    small = [n for n in n_prompts if n < MIN_PROMPTS]
    if small:
        raise ConfigError(f"coverage.n_prompts: {small} below {MIN_PROMPTS} prompts per draw (each draw's bootstrap "
                          "resamples prompts)")


def check_clipping(result: dict, s, allow: bool, path) -> None:
    """A certified lambda is about the clipped cost: deployed with more than MAX_CLIPPED of the calibration costs
    clipped, it certifies a cost the model rarely gives; refused unless allowed (and then said in its statement)."""
    frac = result["guarantee"]["clipped_fraction"]
    total = 0.0 if not frac else frac["below"] + frac["above"]
    if total <= MAX_CLIPPED:
        return
    note = (f"cost_bounds {s.cost_bounds} clip {total:.1%} of the calibration costs (more than {MAX_CLIPPED:.0%}): "
            "the certificate is about the clipped cost")
    flag_clipping(result, note, s.guarantee, allow, path)


def check_feasible(msg: str, allow: bool, where, budget: str = "tau") -> None:
    """A record whose deployed lambda does not reach the budget (``msg`` says how): refused, naming ``where``,
    unless allowed (then written with feasible=false)."""
    if not allow:
        raise DataError(f"{where}: {msg}; raise calibration.lambda_search_max or {budget}, or pass --allow-infeasible")
    logging.getLogger(__name__).warning("%s; writing it with feasible=false", msg)


def flag_clipping(result: dict, note: str, guarantee: str, allow: bool, where, bounds: str = "calibration.cost_bounds"
                  ) -> None:
    """Bounds that clip too much (``note`` says how much): every certified procedure's statement says so, and a
    certified guarantee deployed with them is refused unless allowed (then its statement says so too)."""
    for name in CERTIFIED:
        p = result["procedures"].get(name)
        if p and p.get("statement"):
            p["statement"] += f"; {note}"
    if guarantee in CERTIFIED:
        if not allow:
            raise DataError(f"{where}: calibration.guarantee {guarantee}: {note}; widen {bounds} (fixed before seeing "
                            "these costs) or pass --allow-clipping")
        result["guarantee"]["statement"] += f"; {note}"
    logging.getLogger(__name__).warning("%s", note)


# ---------------------------------------------------------------------------------------------
# A record read back, before a decoder runs at one of its lambdas


def check_record(rec, decoder, tau: float | None, where: str) -> None:
    """The record ``rec`` (a :class:`~lara.calibrate.record.LambdaRecord`) must be this very decoder's: its kind and
    every field of its identity (N, K where stated, schedule, scorers), its tau, and the values its own writer
    guarantees (:func:`check_record_values`). Another decoder's record, one for another schedule, N or tau, or one
    edited by hand is refused, naming both sides."""
    from lara.calibrate.record import check_budget

    want, have = decoder.identity(), rec.decoder
    if have.get("kind") != want["kind"]:
        raise DataError(f"{where}: calibrated for {have.get('kind')!r}, not for {decoder.describe()} "
                        f"({want['kind']!r}): a lambda is calibrated for the decoder that uses it, never borrowed")
    for key, value in want.items():
        if key != "k" and have.get(key) != value:
            raise DataError(f"{where}: calibrated for {key} = {have.get(key)!r}, but the decoder's is {value!r}: "
                            "recalibrate for this decoder")
    if tau is not None:
        check_budget(rec, tau)
    check_record_values(rec, decoder)


def check_record_values(rec, decoder=None) -> None:
    """What the record writer guarantees and a hand edit breaks: its tau is its settings', its decoder is the one its
    settings make (``decoder``'s ``from_settings``), and every procedure's lambda is a point of its grid whose
    recorded calibration mean cost and tokens are the curve's there."""
    where = f"{rec.path}: a {rec.decoder.get('kind')} record"
    st, curves = rec.get("settings") or {}, rec.get("curves") or {}
    try:
        grid = np.asarray(curves["lambda"], dtype=float)
        cost = np.asarray(curves["mean_cost"], dtype=float)
        tokens = np.asarray(curves["mean_tokens"], dtype=float)
        own = decoder.from_settings(st).identity() if decoder is not None else rec.decoder
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{where} without its settings or curves (written by its calibration)") from None
    mismatch = [k for k, v in own.items() if k != "k" and rec.decoder.get(k) != v]
    if mismatch or st.get("tau") != rec.tau:
        raise DataError(f"{where} whose decoder ({rec.decoder}, tau {rec.tau:g}) is not its own settings' ({own}, tau "
                        f"{st.get('tau')}): edited after its calibration wrote it; recalibrate")
    if not (len(grid) == len(cost) == len(tokens) >= 2):
        raise DataError(f"{where} whose curves are not one grid (written by its calibration)")
    for name, p in (rec.get("procedures") or {}).items():
        at = np.flatnonzero(np.isclose(grid, p.get("lambda", np.nan), rtol=0, atol=1e-12))
        if len(at) != 1 or not np.isclose(cost[at[0]], p.get("mean_cost", np.nan), rtol=1e-9, atol=1e-12) or \
                not np.isclose(tokens[at[0]], p.get("mean_tokens", np.nan), rtol=1e-9, atol=1e-12):
            raise DataError(f"{where}: procedures.{name}.lambda = {p.get('lambda')!r} is not the grid point whose "
                            "calibration mean cost and tokens it records: edited after its calibration wrote it; "
                            "recalibrate")


# ---------------------------------------------------------------------------------------------
# The coverage study


def study(pop: Curves, s, tau: float) -> tuple[list[dict], dict]:
    """Repeated calibration on draws of ``s.n_prompts`` prompts i.i.d. from the population ``pop`` with every
    procedure, each chosen lambda's population mean clipped cost against ``tau``: rows per (n, procedure) and the
    population's own facts."""
    from lara.stats import clopper_pearson

    grid = pop.grid
    pop_cost, pop_reward, pop_tokens = (a.mean(axis=0) for a in (pop.clipped, pop.reward, pop.tokens))
    oracle_idx, oracle_status = stable_root(pop_cost[None] <= tau)
    oracle = int(oracle_idx[0])
    rng = np.random.default_rng([s.seed, 4747])
    rows = []
    for n in s.n_prompts:
        found = {p: [] for p in PROCEDURES}
        for rep in range(s.repeats):
            sub = pop.take(rng.integers(0, pop.n_prompts, size=n))
            boot_idx, _ = bootstrap_roots(sub.cost, tau, s.bootstrap, s.seed * 100003 + rep)
            for p, search in searches(sub, s, s.seed + rep, boot_idx).items():
                found[p].append(search)
        for p in PROCEDURES:
            at, ok = np.asarray([f.index for f in found[p]]), np.asarray([f.feasible for f in found[p]])
            cost = pop_cost[at]
            # a procedure that certified nothing deploys nothing: counted apart, never as a violation
            viol = int(((cost > tau + 1e-12) & ok).sum())
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
    facts = {"n_prompts": pop.n_prompts, "lambda_pop": float(grid[oracle]),
             "lambda_pop_status": int(oracle_status[0]), "monotone": bool((np.diff(pop_cost) <= 1e-12).all()),
             "subsets": {"exact": pop.exact, "count": pop.n_subsets}}
    return rows, facts
