"""``lara calibrate-vector``: the vector lambda of several constraints for Best-of-N (``calibration.constraints``).

Procedures (every lambda a vector in the constraints' order; :mod:`lara.calibrate.vector` has the numerics):

* ``soft``: the minimiser of the convex soft dual at ``calibration.beta`` (L-BFGS-B, exact gradient): the Gibbs
  tilt's multipliers, reported; its direction d is the ray every other procedure searches.
* ``hat`` (lambda-hat): the smallest s along d whose exact expected Best-of-N cost vector meets every tau.
* ``bootstrap``: the ``calibration.quantile`` of the prompt bootstrap of that s (the scalar lambda*'s meaning
  along a ray: a heuristic upper bound, no finite-sample guarantee).
* ``ltt`` (with ``calibration.cost_bounds``): Pareto Testing: d chosen on half the prompts, Learn then Test on the
  other half with intersection-union p-values (the largest of the constraints' Hoeffding-Bentkus p-values),
  fixed-sequence down a grid of s fixed in advance: with probability >= 1 - delta over those prompts every
  constraint holds in expectation at once.
* ``ltt_wsr``: the same split, ray and grid, with betting p-values (:mod:`lara.calibrate.betting`): the same
  statement, more often certified where the losses spread little.

``calibration.guarantee`` picks lambda* from bootstrap, ltt or ltt_wsr (crc bounds one risk's expectation; its vector
form is not implemented). With one constraint the scalar calibration itself runs (:func:`lara.calibrate.
calibrate.calibrate`), so its lambdas are the scalar ones bit for bit. For two constraints a brute-force check
over a 2-D grid reports the best feasible grid point's reward beside the ray's: what restricting the search to
one ray costs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, replace

import numpy as np

from lara.calibrate.calibrate import CalibrationSettings
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "calibrate a vector lambda for several constraints (Best-of-N, exact along a ray; LTT for all at once)"

LTT_GRID = 2001  # points of the fixed grid of s on [0, lambda_search_max] that LTT tests from the top down
BRUTE_GRID = 81  # points per axis of the 2-D brute-force check


class VectorScores:
    """Per-prompt rectangles: reward (P, K), costs (P, K, m), mask (P, K), prompt ids; ``source``: the file they
    were read from (:class:`lara.identity.Artifact`, its table and identity; None for arrays made in memory)."""

    def __init__(self, reward, costs, mask, prompt_ids, source=None):
        self.reward, self.costs, self.mask, self.prompt_ids = reward, costs, mask, prompt_ids
        self.source = source
        self.prompts = None if source is None else source.prompts()

    @property
    def n_prompts(self) -> int:
        return len(self.reward)


def load_vector_scores(path, constraints, flag: str = "--scores") -> VectorScores:
    """The constraint scores, checked: one row per (prompt, sample), finite reward and cost_<name> columns, the
    constraints the file was scored for equal to ``constraints``; each constraint's costs are its losses
    (:meth:`lara.constraints.spec.Constraint.loss`: a probability constraint's 1[c > threshold])."""
    from lara import identity
    from lara.calibrate.dual import InputError, PromptScores
    from lara.read.expect import check_pairs
    from lara.read.files import DataError, require_in_range

    columns = [c.column for c in constraints]
    art = identity.table(path, flag, required=("prompt_id", "reward", *columns), finite=("reward", *columns))
    require_in_range(art.df, ("reward", *columns), f"{flag} {path}")
    art.expect("constraints", [c.name for c in constraints], "scored for other constraints")
    scorers = art.identity.get("cost_scorers")
    for c in constraints if isinstance(scorers, dict) else ():
        if c.name in scorers and not scored_by(c, scorers[c.name]):
            raise DataError(f"{flag} {path}: cost_scorers scored {c.name} with {scorers[c.name]}, but --constraints "
                            f"declares {c.name}'s cost {c.cost}; calibrate, decode and audit a constraint on its "
                            "declared cost's scores")
    df = art.df
    if "sample_id" in df.columns:
        check_pairs(df, ["prompt_id", "sample_id"], f"{flag} {path}")
    pid = df["prompt_id"].to_numpy()
    try:
        per = [PromptScores.from_long(pid, df["reward"].to_numpy(float), c.loss(df[c.column])) for c in constraints]
    except InputError as exc:
        raise DataError(f"{flag} {path}: {exc}") from None
    return VectorScores(per[0].reward, np.stack([p.cost for p in per], axis=2), per[0].mask, per[0].prompt_ids,
                        art)


def scored_by(c, scorer) -> bool:
    """Whether ``scorer`` (what lara score-constraints was given for constraint ``c``: its identity's cost_scorers)
    can be c's declared cost: a trained model folder (models/cost, models/cost_<slug>) must be the one the cost names
    (rules/common.smk constraint_scorer); another spec is the cost itself, unless the cost names a trained model
    (a named scorer, e.g. the toy oracle, scores by the constraint's name)."""
    from pathlib import Path

    folder = Path(str(scorer))
    if c.category is None and c.cost not in ("cost", "reward"):
        return str(scorer) == c.cost or folder == Path(c.cost)
    return folder.parent.name != "models" or folder.name == (c.cost if c.category is None else f"cost_{c.slug}")


def _scalar(scores: VectorScores, tau: float, s: CalibrationSettings) -> dict:
    """One constraint: the scalar calibration on its cost, its lambdas as 1-vectors."""
    from lara.calibrate.calibrate import calibrate
    from lara.calibrate.dual import PromptScores

    one = calibrate(PromptScores(scores.reward, scores.costs[..., 0], scores.mask, scores.prompt_ids),
                    replace(s, tau=tau))
    procedures = {name: {"lambda": [p["lambda"]], "feasible": p["feasible"], "statement": p["statement"]}
                  for name, p in one["procedures"].items()}
    procedures["hat"] = {"lambda": [one["lambda_hat"]], "feasible": one["status"] != "infeasible",
                         "direction": [1.0]}
    return {"procedures": procedures, "direction": [1.0], "scalar": {"status": one["status"],
                                                                      "bootstrap": one["bootstrap"]}}


def _vector(scores: VectorScores, tau, n, s: CalibrationSettings, bounds=None) -> dict:
    """The procedures for several constraints; ``bounds``: each constraint's [lo, hi] for LTT (None: no LTT)."""
    from lara.calibrate import vector

    r, c, mask = scores.reward, scores.costs, scores.mask
    hat = vector.bon_along_soft_direction(r, c, mask, tau, n, s.beta, s.lambda_search_max)
    d = np.asarray(hat["direction"])
    procedures = {"soft": {"lambda": hat["soft"], "feasible": bool(hat["solve"]["converged"]), "solve": hat["solve"]},
                  "hat": {"lambda": hat["lambda"], "feasible": hat["lambda"] is not None, "s": hat["s"],
                          "direction": hat["direction"]}}
    boot = vector.bootstrap_along(r, c, mask, d, tau, n, s.lambda_search_max, s.bootstrap, s.seed, s.quantile,
                                  per_prompt=hat["prompt_values"])
    reps = boot.pop("replicates")
    hit_cap = float(np.mean(reps >= s.lambda_search_max))
    procedures["bootstrap"] = {
        "lambda": boot["lambda"], "s": boot["s"], "feasible": hat["lambda"] is not None and hit_cap < 1 - s.quantile,
        "replicates_at_cap": hit_cap,
        "statement": (f"the {s.quantile:g} quantile of {s.bootstrap:,} prompt-bootstrap replicates of the smallest s "
                      "along the soft dual's direction whose expected Best-of-N cost meets every tau: a heuristic "
                      "upper bound, no finite-sample guarantee")}
    if bounds is not None:
        grid = np.linspace(0.0, s.lambda_search_max, LTT_GRID)
        tested = vector.pareto_ltt(r, c, mask, tau, n, s.beta, s.lambda_search_max, grid, s.delta, bounds, s.seed,
                                   p_values=tuple(LTT_P_VALUES.values()))
        for name, kind in LTT_P_VALUES.items():
            procedures[name] = _ltt_procedure(tested[kind], s, bounds, scores)
    return {"procedures": procedures, "direction": hat["direction"]}


LTT_P_VALUES = {"ltt": "hb", "ltt_wsr": "wsr"}  # the vector LTT procedures and their p-values
P_VALUE_NAMES = {"hb": "Hoeffding-Bentkus p-values", "wsr": "betting p-values (Waudby-Smith & Ramdas 2024, the "
                                                            "test half's prompts in one seeded order)"}


def _ltt_procedure(lt: dict, s: CalibrationSettings, bounds, scores: VectorScores) -> dict:
    """One LTT procedure's record: its lambda (the end of the search along the direction, marked not certified,
    when it certified nothing), statement, bounds and clipped fractions."""
    certified = lt["lambda"] is not None
    if not certified:  # as the scalar LTT: the end of the search, marked not certified
        lt = lt | {"s": s.lambda_search_max, "lambda": (s.lambda_search_max * np.asarray(lt["direction"])).tolist()}
    how = P_VALUE_NAMES[lt["p_values"]]
    return lt | {
        "feasible": certified,
        "statement": (f"with probability >= {1 - s.delta:g} over the {lt['n_test']} test-half prompts, every "
                      "constraint's expected Best-of-N cost (clipped to its bounds) is <= its tau at this "
                      f"lambda (Pareto Testing: direction from the other {lt['n_choose']} prompts, "
                      f"intersection-union {how}, fixed sequence down the grid)"
                      if certified else
                      f"not certified: no s on the grid along the direction from {lt['n_choose']} prompts "
                      f"rejects 'some constraint is missed' at delta {s.delta:g} with {lt['n_test']} prompts, "
                      f"{how} and the cost bounds as fixed; lambda is the end of the search (lambda_search_max "
                      "along it)"),
        "bounds": bounds, "clipped_fraction": clipped_fractions(scores, bounds)}


def clipped_fractions(scores: VectorScores, bounds) -> list[float]:
    """Each constraint's share of calibration costs outside its bounds (what a certificate's clipping changes)."""
    live = scores.costs[scores.mask]
    return [float(np.mean((live[:, j] < lo) | (live[:, j] > hi))) for j, (lo, hi) in enumerate(bounds)]


def check_clipping(result: dict, constraints, s: CalibrationSettings, allow: bool, path) -> None:
    """As the scalar calibration (:func:`lara.calibrate.procedures.check_clipping`): bounds that clip more than
    MAX_CLIPPED of some constraint's calibration costs make the certificate one about a cost the model rarely
    gives; a deployed certified lambda is then refused unless allowed, and every certified statement says it."""
    from lara.calibrate.procedures import MAX_CLIPPED, flag_clipping

    frac = result["guarantee"].get("clipped_fraction") or []
    over = [f"{c.name} {f:.1%}" for c, f in zip(constraints, frac, strict=False) if f > MAX_CLIPPED]
    if over:
        note = (f"the cost bounds {result['guarantee']['bounds']} clip {', '.join(over)} of the calibration costs "
                f"(more than {MAX_CLIPPED:.0%}): the certificate is about the clipped costs")
        flag_clipping(result, note, s.guarantee, allow, path, "each constraint's bounds or calibration.cost_bounds")


def brute_force(scores: VectorScores, tau, n, points, top: float, grid: int = BRUTE_GRID) -> dict:
    """Two constraints: the mean expected Best-of-N reward and costs on a grid over [0, top]^2; the best feasible
    grid point against each procedure's lambda (their exact values there)."""
    from lara.calibrate.vector import columns, expected_at

    r, c, mask = scores.reward, scores.costs, scores.mask
    axis = np.linspace(0.0, top, grid)

    def at(lam):
        v = expected_at(r, c, mask, lam, n, r, *columns(c)).mean(axis=1)
        return float(v[0]), v[1:]

    table = [(a, b, *at([a, b])) for a in axis for b in axis]
    tau = np.asarray(tau)
    feasible = [(a, b, rew, cost) for a, b, rew, cost in table if np.all(cost <= tau + 1e-12)]
    best = max(feasible, key=lambda t: (t[2], -t[0] - t[1])) if feasible else None
    out = {"grid": grid, "top": top, "feasible_points": len(feasible), "points": grid * grid,
           "best": None if best is None else {"lambda": [best[0], best[1]], "reward": best[2],
                                              "cost": best[3].tolist()}}
    for name, lam in points.items():
        if lam is not None:
            rew, cost = at(lam)
            out[name] = {"lambda": list(lam), "reward": rew, "cost": cost.tolist(),
                         "feasible": bool(np.all(cost <= tau + 1e-12))}
    return out


def check_losses(scores: VectorScores, constraints) -> None:
    """A probability constraint whose loss is 0 for every calibration response has nothing to calibrate: its
    threshold lies above every score (in other units than the cost's?)."""
    from lara.config import ConfigError

    for j, c in enumerate(constraints):
        if c.kind == "probability" and not scores.costs[..., j][scores.mask].any():
            raise ConfigError(f"calibration.constraints.{c.name}.threshold: {c.threshold:g}: no calibration response "
                              "scores above it, so the loss 1[c > threshold] is 0 for every one and there is "
                              "nothing to calibrate (a threshold in the cost's units?)")


def check_calibration(s: CalibrationSettings, m: int) -> None:
    """What the constraints stage can calibrate for ``m`` constraints (calibrate-vector, and the coverage study that
    measures it): Best-of-N, and a deployed procedure that holds every constraint."""
    from lara.config import ConfigError

    if s.mode != "bon":
        raise ConfigError("calibration.mode: soft: the constraints stage calibrates for Best-of-N (mode bon)")
    if m > 1 and s.guarantee == "crc":
        raise ConfigError("calibration.guarantee: crc bounds one risk; with several constraints use bootstrap or ltt "
                          "(ltt holds every constraint at once)")


def vector_calibrate(scores: VectorScores, constraints, s: CalibrationSettings) -> dict:
    from lara.calibrate.vector import expected_vector
    from lara.config import ConfigError
    from lara.constraints.spec import bounds as cost_bounds

    check_calibration(s, len(constraints))  # (run checked the losses before the data's floors)
    tau = [c.tau for c in constraints]
    k_min = int(scores.mask.sum(axis=1).min())
    n = s.bon_n
    if n is not None and n > k_min:
        raise ValueError(f"Best-of-N with N = {n} needs N <= K; the scores have K = {k_min} samples per prompt")
    t0 = time.perf_counter()
    limits = cost_bounds(constraints, s.cost_bounds)
    found = (_scalar(scores, tau[0], s if limits is None else replace(s, cost_bounds=limits[0]))
             if len(constraints) == 1 else _vector(scores, tau, n, s, limits))
    procedures = found["procedures"]
    deployed = procedures.get(s.guarantee)
    if deployed is None:
        raise ConfigError(f"calibration.guarantee: {s.guarantee} needs cost bounds (calibration.cost_bounds or "
                          "each constraint's bounds)")
    out = {"constraints": [asdict(c) for c in constraints], "names": [c.name for c in constraints], "tau": tau,
           "lambda_hat": procedures["hat"]["lambda"], "lambda_star": deployed["lambda"],
           "guarantee": {"procedure": s.guarantee, "delta": s.delta if s.guarantee in ("ltt", "ltt_wsr") else None,
                         "cost_bounds": s.cost_bounds, "bounds": limits, "statement": deployed.get("statement"),
                         "clipped_fraction": None if limits is None else clipped_fractions(scores, limits)},
           "feasible": bool(procedures["hat"]["feasible"] and deployed["feasible"]),
           "direction": found["direction"], "procedures": procedures,
           "decoder": {"kind": "best_of_n", "n": n or k_min, "k": k_min}, "n_prompts": scores.n_prompts}
    for key in ("lambda_hat", "lambda_star"):
        if out[key] is not None:
            out[f"decoder_cost_at_{key}"] = expected_vector(scores.reward, scores.costs, scores.mask, out[key],
                                                            n).mean(axis=0).tolist()
    if "scalar" in found:
        out["scalar"] = found["scalar"]
    if len(constraints) == 2:
        lams = [procedures[k]["lambda"] for k in ("hat", "bootstrap", "soft")  # the grid resolves these (an
                if k in procedures and procedures[k].get("lambda") is not None]   # uncertified LTT sits at the cap)
        top = min(s.lambda_search_max, max(0.05, 2.0 * max(max(lam) for lam in lams))) if lams else s.lambda_search_max
        out["brute_force"] = brute_force(scores, tau, n, {k: p.get("lambda") for k, p in procedures.items()}, top)
    out["timing_s"] = time.perf_counter() - t0
    return out


def add_arguments(parser) -> None:
    parser.add_argument("--scores", required=True, help="the calibration samples' constraint scores "
                                                        "(reward, cost_<name> per constraint)")
    parser.add_argument("--constraints", required=True, help="JSON list of the constraints (calibration.constraints)")
    add_settings_arguments(parser, CalibrationSettings)
    parser.add_argument("--allow-clipping", action="store_true",
                        help="deploy a certified lambda although the cost bounds clip more than 1%% of some "
                             "constraint's calibration costs (said in its statement)")
    parser.add_argument("--allow-infeasible", action="store_true",
                        help="write the record when no lambda meets every tau (feasible: false) instead of failing")
    parser.add_argument("--out", required=True, help="the vector lambda record (JSON)")


def run(args) -> None:
    from lara import identity
    from lara.calibrate.calibrate import check_calibration_data
    from lara.calibrate.procedures import check_feasible
    from lara.calibrate.record import provenance
    from lara.constraints.spec import from_arg
    from lara.io import write_json
    from lara.read.files import DataError
    from lara.settings import nonfinite

    s = read_settings(args, CalibrationSettings)  # its rules: the floor of bootstrap replicates, ...
    constraints = from_arg(args.constraints)
    role = identity.expect_role(args.scores, "--scores", "calibration", "calibrating on the prompts the audit holds "
                                "out makes the audit in-sample")
    scores = load_vector_scores(args.scores, constraints)
    check_losses(scores, constraints)
    for j, c in enumerate(constraints):
        check_calibration_data(scores.n_prompts, scores.mask.sum(axis=1), scores.costs[..., j][scores.mask], [c.tau],
                               s, f"--scores {args.scores} (constraint {c.name})")
    log.info("%d prompts, %d constraints %s, tau %s", scores.n_prompts, len(constraints),
             [c.name for c in constraints], [c.tau for c in constraints])
    try:
        result = vector_calibrate(scores, constraints, s)
    except ValueError as exc:
        raise DataError(f"--scores {args.scores}: {exc}") from None
    check_clipping(result, constraints, s, args.allow_clipping, f"--scores {args.scores}")
    if not result["feasible"]:
        msg = (f"no lambda in [0, {s.lambda_search_max}]^{len(constraints)} along the searched ray meets every tau "
               f"{result['tau']} ({s.guarantee})")
        check_feasible(msg, args.allow_infeasible, f"--scores {args.scores}", "the taus")
    made = identity.stamp("lambda_vector", args.out, role=role, tau=result["tau"], names=result["names"],
                          procedure=s.guarantee, decoder=result["decoder"],
                          # the scorers the scores were made with (score-constraints stamps them): the record keeps
                          # them, and decoding and audits refuse others
                          **identity.inherit(scores.source.identity, "reward_scorer", "cost_scorers"),
                          prompts=scores.prompts.record(with_keys=True), made_from={"--scores": args.scores})
    result |= provenance(s, args.scores, **{identity.KEY: made})
    bad = nonfinite({k: v for k, v in result.items() if k != "settings"})
    if bad:
        raise DataError(f"{args.out}: refusing to write a record whose {', '.join(bad)} is not finite")
    write_json(args.out, result)
    for name, p in result["procedures"].items():
        log.info("%s: lambda %s%s", name, p.get("lambda"), " (deployed as lambda*)" if name == s.guarantee else "")
    for key in ("lambda_hat", "lambda_star"):
        if f"decoder_cost_at_{key}" in result:
            log.info("expected Best-of-%d cost at %s: %s (tau %s)", result["decoder"]["n"], key,
                     result[f"decoder_cost_at_{key}"], result["tau"])
    if "brute_force" in result:
        log.info("brute force on a %d^2 grid over [0, %.3g]^2: best feasible %s", BRUTE_GRID,
                 result["brute_force"]["top"], result["brute_force"]["best"])
