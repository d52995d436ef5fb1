"""``lara calibrate``: the deployed multiplier lambda* from reward/cost scores of samples
from the reference policy.

    lara calibrate --scores scores.parquet --tau -0.5 --beta 1 --lambda-max 5 \\
        --bootstrap 10000 --quantile 0.975 --seed 0 --out lambda.json

The scores file (parquet, CSV or jsonl) has one row per response with columns
``prompt_id, reward, cost``; prompts may have different numbers of samples.

``--weights weights.parquet`` (``lara shift-check``: one covariate-shift weight per calibration prompt, an
estimate of dP_deploy / dP_cal) calibrates every procedure for the deployment prompt distribution instead (Best-of-N
mode only; :mod:`lara.calibrate.dual`, :mod:`lara.calibrate.certify`, docs/shift.md). Below the weights'
``min_ess`` (config key deployment.shift.min_ess, in the weights' identity) the record is written with ``certified:
false`` and :func:`lara.calibrate.record.read_lambda` refuses it to every decoder; its identity kind is
``lambda_weighted``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from lara.calibrate.certify import (
    CERTIFIED,
    WEIGHTED,
    certified_lambda,
    clip_costs,
    clipped_steps,
    effective_sample_size,
    equal_weights,
    hb_p_value,
    statement,
    weighted_p_value,
)
from lara.calibrate.decoder import MIN_PROMPTS
from lara.calibrate.dual import InputError, PromptScores, bootstrap, dual, dual_grad, mean_cost, solve
from lara.calibrate.procedures import (
    MAX_CLIPPED,
    QUANTILES,
    CalibrationRules,
    bootstrap_summary,
    check_clipping,
    check_feasible,
)
from lara.calibrate.record import provenance, write_lambda
from lara.io import sha256_file
from lara.read.files import DataError, read_table, require_in_range
from lara.settings import (
    COST_RESOLUTION,
    Settings,
    add_settings_arguments,
    cross_key,
    read_settings,
    seed_setting,
    setting,
)

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class CalibrationSettings(CalibrationRules, Settings):
    """calibration: the dual calibration of lambda (the K samples per prompt are the sampler's key)."""

    SECTION: ClassVar[str] = "calibration"

    tau: float = setting(help="Cost threshold tau of the constraint E[c] <= tau; the config may list several (each "
                              "its own lambda.json and lambda* decodes from the same samples and models; the first "
                              "is the main one, also Safe-RLHF's budget).", several=True)
    beta: float = setting(1.0, "Soft mode only: the KL coefficient beta of the dual; its lambda targets the Gibbs "
                               "tilt pi_ref exp((r - lambda c) / beta), not argmax Best-of-N (the paper does not "
                               "state beta).", exclusive_minimum=0)
    lambda_search_max: float = setting(5.0, "Upper end Lambda of the calibration's search interval [0, Lambda] (not "
                                            "the decoders' `max` setting: decode.overpenalised_lambda).",
                                       exclusive_minimum=0)
    bootstrap: int = setting(10000, "Bootstrap replicates over prompts.", minimum=1)
    quantile: float = setting(0.975, "Bootstrap quantile deployed as lambda*.", exclusive_minimum=0,
                              exclusive_maximum=1)
    mode: Literal["soft", "bon"] = setting(
        "bon", "bon: exact for the Best-of-N decoder with N = decode.bon_n drawn from the K samples (lambda-hat = "
               "the smallest lambda whose expected Best-of-N cost is <= tau); soft: Algorithm 1's KL-regularised "
               "dual at beta (targets the Gibbs tilt). The token-level decoders use the same lambda* (a heuristic).")
    tolerance: float = setting(1e-8, "Bisection tolerance in lambda.", exclusive_minimum=0)
    seed: int = seed_setting()
    bon_n: int | None = setting(None, "Bon mode: the decoder's N (null = K, every sample; N > K is an error); "
                                      "the rule calibrating Fig. 1's other sizes sets its own N.", minimum=1,
                                key="decode.bon_n")
    guarantee: Literal["bootstrap", "crc", "ltt", "ltt_wsr"] = setting(
        "bootstrap", "The procedure whose lambda is deployed as lambda* (what the decoders read): bootstrap (the "
                     "paper's: the `quantile` of a prompt bootstrap of lambda-hat, no finite-sample guarantee), crc "
                     "(conformal risk control: expected cost <= tau averaged over calibration draws), ltt (Learn "
                     "then Test: expected cost <= tau with probability >= 1 - delta; Hoeffding-Bentkus p-values) or "
                     "ltt_wsr (the same with variance-adaptive betting p-values, Waudby-Smith & Ramdas 2024). crc, "
                     "ltt and ltt_wsr are exact for Best-of-N (mode bon) and need cost_bounds; docs/calibration.md.")
    delta: float = setting(0.1, "ltt: the probability that the certified lambda misses tau (over the draw of the "
                                "calibration prompts).", exclusive_minimum=0, exclusive_maximum=1)
    cost_bounds: list[float] | None = setting(
        None, "[lo, hi]: bounds of the cost, fixed before the calibration samples are seen (not read off them); "
              "costs are clipped to them for crc and ltt, whose lambdas are then computed beside the bootstrap's "
              "and recorded whatever `guarantee` deploys (null: bootstrap only). The clipped fraction is "
              "reported; the guarantees are about the clipped cost.", length=2)
    grid_points: int = setting(101, "Points of each grid of the diagnostic curves of g and g' over [0, Lambda] (one "
                                    "linear, one logarithmic from Lambda/10^4, so small lambdas are resolved).",
                               minimum=2, config=False)


    @cross_key("calibration.guarantee", "calibration.mode", witness={"calibration": {"guarantee": "crc",
                                                                                     "mode": "soft"}})
    def guarantee_exact(self):
        if self.guarantee != "bootstrap" and self.mode != "bon":
            return (f"calibration.guarantee: {self.guarantee} is exact for Best-of-N only (calibration.mode: bon); "
                    "soft mode deploys the bootstrap's lambda*")

    @cross_key("calibration.lambda_search_max", witness={"calibration": {"lambda_search_max": 1e13,
                                                                         "tolerance": 1e-8}})
    def search_resolved(self):
        if self.lambda_search_max > LAMBDA_SEARCH_LIMIT:
            return (f"calibration.lambda_search_max: {self.lambda_search_max:g} is beyond 1e12, "
                    "where the search's grids and curves lose their resolution; a lambda that large says the costs "
                    "are in other units than the rewards")

    @cross_key("calibration.tolerance", "calibration.lambda_search_max",
               witness={"calibration": {"tolerance": 0.1, "lambda_search_max": 5.0}})
    def tolerance_resolves(self):
        if self.tolerance > self.lambda_search_max * 1e-3 * (1 + 1e-9):
            return (f"calibration.tolerance: {self.tolerance:g} is more than a thousandth of lambda_search_max "
                    f"({self.lambda_search_max:g}): the bisection would not resolve lambda; use at most "
                    f"{self.lambda_search_max * 1e-3:g}")


LAMBDA_SEARCH_LIMIT = 1e12  # beyond it the search's grids lose their resolution


def load_scores(path: str | Path, prompts: list | None = None) -> PromptScores:
    """The calibration scores, checked (numeric, one row per sample, each prompt once by id and text); ``prompts``
    (a list) receives their :class:`lara.identity.PromptSet`."""
    from lara import identity
    from lara.read.expect import check_pairs

    df = read_table(path, required=("prompt_id", "reward", "cost"))
    found = identity.prompt_set(df, str(path))
    if prompts is not None:
        prompts.append(found)
    for col in ("reward", "cost"):
        if not pd.api.types.is_numeric_dtype(df[col]) or pd.api.types.is_bool_dtype(df[col]):
            bad = pd.to_numeric(df[col], errors="coerce").isna() & df[col].notna()
            row = int(np.flatnonzero(bad.to_numpy())[0]) if bad.any() else 0
            raise DataError(f"{path}: column {col!r} must be numeric; row {row} holds {df[col].iloc[row]!r}")
    if "sample_id" in df.columns:
        check_pairs(df, ["prompt_id", "sample_id"], str(path))
    require_in_range(df, ("reward", "cost"), path)
    try:
        return PromptScores.from_long(df["prompt_id"].to_numpy(), df["reward"].to_numpy(float),
                                      df["cost"].to_numpy(float))
    except InputError as exc:
        raise DataError(f"{path}: {exc}") from None


def calibrate(scores: PromptScores, s: CalibrationSettings, weights: np.ndarray | None = None,
              min_ess: float | None = None) -> dict:
    """Point estimate, bootstrap and diagnostics as a JSON-ready dict. ``weights``: covariate-shift weights of
    the prompts (aligned with ``scores.prompt_ids``, finite and > 0; Best-of-N mode only), which make every
    lambda one for the deployment distribution they describe; certified when their effective sample size is at
    least ``min_ess`` (the record's ``certified``; without weights the record has neither key)."""
    pw = unequal_weights(weights, s)
    k_min = int(scores.counts.min())
    bon_n, steps = None, None
    t0 = time.perf_counter()
    if s.mode == "bon":
        from lara.calibrate.bestofn import steps as bon_steps

        bon_n = s.bon_n  # None: each prompt's K (all its samples)
        if bon_n is not None and bon_n > k_min:
            raise ValueError(f"Best-of-N calibration with N = {bon_n} (bon_n) needs N <= K, but the scores have "
                             f"K = {k_min} samples per prompt (the fewest of any prompt)")
        steps = bon_steps(scores.reward, scores.cost, scores.mask, bon_n, s.lambda_search_max)
    sol = solve(scores, s.tau, s.beta, s.lambda_search_max, s.tolerance, s.mode, bon_n=bon_n, bon_steps=steps,
                weights=pw)
    t1 = time.perf_counter()
    boot = bootstrap(scores, s.tau, s.beta, s.lambda_search_max, s.bootstrap, s.seed, s.mode, bon_n=bon_n,
                     bon_steps=steps, weights=pw)
    t2 = time.perf_counter()
    lams = boot.lams
    grid = np.union1d(np.linspace(0.0, s.lambda_search_max, s.grid_points),
                      np.geomspace(s.lambda_search_max * 1e-4, s.lambda_search_max, s.grid_points))
    counts = scores.counts
    boot_star = float(np.quantile(lams, s.quantile))
    procedures = {"bootstrap": {
        "lambda": boot_star, "feasible": sol.feasible,
        "statement": statement("bootstrap", lam=boot_star, tau=s.tau, n_prompts=scores.n_prompts, bon_n=bon_n,
                               feasible=sol.feasible, quantile=s.quantile, replicates=s.bootstrap,
                               ess=None if pw is None else effective_sample_size(pw))}}
    clipped = None
    if s.mode == "bon" and s.cost_bounds is not None:
        clipped, procedures_certified = certify(scores, s, bon_n, k_min, steps, pw)
        procedures |= procedures_certified
    t3 = time.perf_counter()
    shift = {} if weights is None else _weighted(procedures, weights, min_ess, s.tau)
    deployed = procedures[s.guarantee]
    lambda_star = deployed["lambda"]
    norm = None if pw is None else pw / pw.sum()
    decoder_cost = mean_cost(scores, [sol.lam, lambda_star], s.beta, s.mode, weights=norm, bon_n=bon_n)
    return shift | {
        "lambda_hat": sol.lam,
        "lambda_star": lambda_star,
        # the procedure that chose lambda_star and what it promises; every procedure's lambda beside it
        "guarantee": {"procedure": s.guarantee, "delta": s.delta if s.guarantee in ("ltt", "ltt_wsr") else None,
                      "cost_bounds": s.cost_bounds, "clipped_fraction": clipped,
                      "feasible": deployed["feasible"], "statement": deployed["statement"]},
        "procedures": procedures,
        # which decoder these lambdas are for, and its calibration-set expected cost at them
        "decoder": ({"kind": "best_of_n", "n": bon_n or (k_min if counts.min() == counts.max() else None),
                     "k": k_min} if s.mode == "bon"
                    else {"kind": "gibbs_tilt", "beta": s.beta}),
        "decoder_cost_at_lambda_hat": float(decoder_cost[0]),
        "decoder_cost_at_lambda_star": float(decoder_cost[1]),
        "status": sol.status,
        "feasible": sol.feasible and deployed["feasible"],
        "cost_range": list(sol.cost_range),
        "bisection_iterations": sol.iterations,
        "bootstrap": bootstrap_summary(lams, boot.status, s, {str(q): float(np.quantile(lams, q))
                                                              for q in sorted({*QUANTILES, s.quantile})}),
        "tau": s.tau,
        "beta": s.beta,
        "lambda_search_max": s.lambda_search_max,
        "mode": s.mode,
        "tolerance": s.tolerance,
        "seed": s.seed,
        "n_prompts": scores.n_prompts,
        "samples_per_prompt": {"min": int(counts.min()), "max": int(counts.max()),
                               "mean": float(counts.mean()), "total": int(counts.sum())},
        "curves": {"lambda": grid.tolist(),
                   "g": dual(scores, grid, s.tau, s.beta, s.mode, weights=pw).tolist(),
                   "g_prime": dual_grad(scores, grid, s.tau, s.beta, s.mode, bon_n=bon_n, weights=pw).tolist()},
        "timing_s": {"solve": t1 - t0, "bootstrap": t2 - t1, "certified": t3 - t2},
    }


def unequal_weights(weights, s: CalibrationSettings) -> np.ndarray | None:
    """The covariate-shift weights the computations use: None when there are none or all are equal (no reweighting:
    computed as the plain calibration, so its lambdas are exactly those); refused outside Best-of-N mode."""
    if weights is not None and s.mode != "bon":
        raise ValueError("a covariate-shift weighted calibration (--weights) is exact for Best-of-N only "
                         "(calibration.mode: bon); soft mode's tilted cost is a ratio estimate, not a mean of "
                         "per-prompt losses")
    if weights is not None and s.guarantee not in ("bootstrap", *WEIGHTED):
        raise ValueError(f"calibration.guarantee: {s.guarantee} has no covariate-shift weighted version (weighted: "
                         f"bootstrap, {', '.join(WEIGHTED)}), so a reweighted calibration cannot deploy it")
    return None if weights is None or equal_weights(weights) else np.asarray(weights, dtype=float)


def certify(scores: PromptScores, s: CalibrationSettings, bon_n: int | None, k_min: int,
            cost_steps=None, weights: np.ndarray | None = None) -> tuple[dict, dict]:
    """The CRC and LTT lambdas of Best-of-N (lara.calibrate.certify) with their guarantees, and the fraction of
    calibration costs the bounds clip (``cost_steps``: the unclipped cost's steps, reused when nothing is clipped;
    ``weights``: unequal covariate-shift weights, for the weighted versions)."""
    from lara.calibrate.bestofn import expected
    from lara.calibrate.betting import betting_p_values, prompt_order

    clip, frac = clip_costs(scores.cost, scores.mask, s.cost_bounds)
    st = clipped_steps(scores, bon_n, s.lambda_search_max, s.cost_bounds, cost_steps)
    n = scores.n_prompts
    out = {}
    for proc in CERTIFIED if weights is None else WEIGHTED:
        c = certified_lambda(st, n, proc, s.tau, s.lambda_search_max, s.cost_bounds, s.delta, seed=s.seed,
                             shift=weights)
        at = expected(scores.reward, scores.cost, scores.mask, [c.lam], bon_n, clip)[0, :, 0]
        mean = float(at.mean() if weights is None else weights @ at / weights.sum())
        out[proc] = {"lambda": c.lam, "feasible": c.feasible, "threshold": c.threshold, "clipped_mean_cost": mean,
                     "statement": statement(proc, lam=c.lam, tau=s.tau, n_prompts=n, bon_n=bon_n or k_min,
                                            feasible=c.feasible, delta=s.delta, bounds=s.cost_bounds,
                                            clipped=frac["below"] + frac["above"],
                                            ess=None if weights is None else effective_sample_size(weights))}
        if proc == "ltt":
            p = (hb_p_value(mean, n, s.tau, s.cost_bounds) if weights is None
                 else weighted_p_value(mean, effective_sample_size(weights), s.tau, s.cost_bounds))
            out[proc] |= {"delta": s.delta, "p_value": float(p)}
        elif proc == "ltt_wsr":  # the betting p-value of the losses at the certified lambda, in the test's order
            p = betting_p_values(at, s.tau, s.delta, s.cost_bounds, prompt_order(n, s.seed))
            out[proc] |= {"delta": s.delta, "p_value": float(p), "order_seed": s.seed}
    return frac, out


def _weighted(procedures: dict, weights: np.ndarray, min_ess: float | None, tau: float) -> dict:
    """The weighted record's own keys (``certified``, the weights' ESS), and every procedure's statement said for
    the deployment distribution the weights describe, or withdrawn below ``min_ess``."""
    ess = effective_sample_size(weights)
    certified = min_ess is not None and ess >= min_ess
    about = ("covariate shift: the promise is about the deployment prompt distribution as the shift check's "
             "classifier estimates it from the prompts alone (it assumes a prompt's responses and their costs do "
             "not change)")
    for proc in procedures.values():
        if certified:
            proc["statement"] = f"{proc['statement']}; {about}"
        else:
            proc["statement"] = (f"not certified: the weights' effective sample size {ess:.1f} is below "
                                 f"deployment.shift.min_ess = {min_ess:g}, too few calibration prompts resemble the "
                                 f"deployment prompts; lambda = {proc['lambda']:.6g} is an estimate no decoder "
                                 f"deploys (tau = {tau:g})")
    return {"certified": bool(certified)}


# ---------------------------------------------------------------------------------------------
# CLI: lara calibrate

HELP = "calibrate the Lagrange multiplier: bisection on the empirical dual plus a prompt bootstrap"


def add_arguments(parser) -> None:
    parser.add_argument("--scores", required=True, help="parquet/CSV/jsonl with prompt_id, reward, cost")
    add_settings_arguments(parser, CalibrationSettings)
    parser.add_argument("--allow-infeasible", action="store_true",
                        help="write lambda_search_max (feasible: false) instead of failing when tau is unreachable")
    parser.add_argument("--allow-clipping", action="store_true",
                        help=f"deploy a crc or ltt lambda although cost_bounds clip more than "
                        f"{MAX_CLIPPED * 100:g}%% of the calibration costs (the guarantee is then about a cost "
                        "the cost model rarely gives)")
    parser.add_argument("--weights", default=None,
                        help="covariate-shift weights of the calibration prompts (lara shift-check): calibrate for "
                        "the deployment prompt distribution they describe (bon mode; docs/shift.md)")
    parser.add_argument("--out", required=True, help="output lambda.json")


WEIGHTS_KIND = "shift_weights"  # the identity kind of lara shift-check's weights (lara.deploy.shift)


def load_weights(path, scores: PromptScores, scores_path) -> tuple[np.ndarray, dict]:
    """The covariate-shift weights of ``scores``' prompts, in their order, normalised to mean 1, and what the record
    says of them (path, sha256, ess, min_ess, n, scenario). Every calibration prompt has exactly one weight, finite
    and > 0; the file is ``lara shift-check``'s (its identity carries min_ess)."""
    from lara import identity

    made = identity.read_identity(path)
    if made.get("kind") != WEIGHTS_KIND or not isinstance(made.get("min_ess"), (int, float)):
        raise DataError(f"--weights {path}: not the weights of `lara shift-check` (identity kind {made.get('kind')!r}"
                        f", expected {WEIGHTS_KIND!r} with min_ess, the config key deployment.shift.min_ess)")
    df = read_table(path, required=("prompt_id", "weight"))
    keys = df["prompt_id"].map(identity.id_key)
    twice = keys.duplicated(keep=False)
    if twice.any():
        pid = df["prompt_id"][twice.to_numpy()].iloc[0]
        raise DataError(f"--weights {path}: prompt {pid!r} has {int(twice.sum())} weights, expected one")
    value = pd.to_numeric(df["weight"], errors="coerce").to_numpy(float)
    bad = ~(np.isfinite(value) & (value > 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = df["weight"].iloc[i]
        shown = repr(raw) if np.isnan(value[i]) and not isinstance(raw, (float, np.floating)) else value[i]
        raise DataError(f"--weights {path}: the weight of prompt {df['prompt_id'].iloc[i]!r} is {shown}; every "
                        f"weight must be a finite number > 0 ({int(bad.sum())} of {len(value)} are not)")
    by_key = dict(zip(keys, value, strict=True))
    wanted = [identity.id_key(p) for p in scores.prompt_ids]
    missing = [p for p, k in zip(scores.prompt_ids, wanted, strict=True) if k not in by_key]
    if missing:
        raise DataError(f"--weights {path}: calibration prompt {missing[0]!r} of {scores_path} has no weight "
                        f"({len(missing)} of {len(wanted)} have none): weights of another calibration set?")
    extra = sorted(set(by_key) - set(wanted))
    if extra:
        pid = df["prompt_id"][keys == extra[0]].iloc[0]
        raise DataError(f"--weights {path}: prompt {pid!r} is not a calibration prompt of {scores_path} "
                        f"({len(extra)} such): weights of another calibration set?")
    w = np.array([by_key[k] for k in wanted])
    w /= w.mean()
    info = {"path": str(path), "sha256": sha256_file(path), "ess": effective_sample_size(w),
            "min_ess": float(made["min_ess"]), "n": len(w), "scenario": made.get("scenario"),
            "equal": equal_weights(w)}
    return w, info


def check_calibration_data(n_prompts: int, counts, costs, taus, s, where) -> None:
    """Statements only about what exists: enough distinct prompts to bootstrap over, one K for every prompt unless
    N is given, costs on a scale the calibration can tell apart (its ties and tau's tolerance are 1e-12 absolute),
    and a bisection tolerance that resolves lambda on [0, Lambda]."""
    from lara.config import ConfigError

    if n_prompts < MIN_PROMPTS:
        raise DataError(f"{where}: {n_prompts} distinct prompt(s); a calibration needs at least "
                        f"{MIN_PROMPTS} (its bootstrap resamples prompts): no lambda* is stated")
    counts = np.asarray(counts)
    if s.mode == "bon" and s.bon_n is None and counts.min() != counts.max():
        raise DataError(f"{where}: prompts have {int(counts.min())} to {int(counts.max())} samples; Best-of-N's N "
                        "is then not one number: give calibration.bon_n (--bon-n) explicitly")
    scale = float(np.max(np.abs(np.asarray(costs, dtype=float)))) if np.size(costs) else 0.0
    if scale < COST_RESOLUTION:
        raise DataError(f"{where}: every cost is at most {scale:.3g} in magnitude, below {COST_RESOLUTION:g}: the "
                        "calibration tells scores apart to 1e-12, so costs in such units read as ties; rescale the "
                        "costs and tau (costs in other units than tau?)")
    for tau in taus:  # the constraints' taus (the main one is a settings rule: CalibrationSettings.tau_resolved)
        if tau != 0 and abs(tau) < COST_RESOLUTION:
            raise ConfigError(f"calibration.tau: {tau:g} is within {COST_RESOLUTION:g} of 0, below the resolution "
                              "the calibration compares costs with; rescale the costs and tau")


def check_inputs(args, s: CalibrationSettings) -> tuple[PromptScores, dict]:
    """The scores: calibration prompts (their identity's role), each counted once;
    the identity the record will carry."""
    from lara import identity
    from lara.config import ConfigError

    role = identity.expect_role(args.scores, "--scores", "calibration", "the samples of the calibration prompts: "
                                "calibrating on the prompts the audit holds out makes the audit in-sample")
    found: list = []
    scores = load_scores(args.scores, found)
    weighted = getattr(args, "weights", None)
    if weighted is not None and s.mode != "bon":
        raise ConfigError(f"--weights {weighted}: a covariate-shift weighted calibration is exact for Best-of-N only "
                          f"(calibration.mode: bon, not {s.mode}): soft mode's tilted cost is a ratio estimate, not "
                          "a mean of per-prompt losses")
    made = identity.stamp("lambda" if weighted is None else "lambda_weighted", args.out, role=role, tau=s.tau,
                          mode=s.mode, procedure=s.guarantee, prompts=found[0].record(with_keys=True),
                          # the scorers the record's tau is in the units of: decoders and streams must use them
                          **identity.inherit(identity.read_identity(args.scores), "reward_scorer", "cost_scorer"),
                          made_from={"--scores": args.scores, "--weights": weighted})
    return scores, made


def run(args) -> None:
    s = read_settings(args, CalibrationSettings)
    scores, made = check_inputs(args, s)
    check_calibration_data(scores.n_prompts, scores.counts, scores.cost[scores.mask], [s.tau], s,
                           f"--scores {args.scores}")
    log.info("%d prompts, %d responses; settings %s", scores.n_prompts, int(scores.counts.sum()), s)
    weights, shift = None, None
    if args.weights is not None:
        try:  # what a weighted calibration supports, said of --weights before its file is read
            unequal_weights(np.ones(1), s)
        except ValueError as exc:
            raise DataError(f"--weights {args.weights}: {exc}") from None
        weights, shift = load_weights(args.weights, scores, args.scores)
        from lara.identity import ID_KEY, read_identity

        weights_made = read_identity(args.weights)  # read once: its prompt texts and its stream
        over = weights_made.get("prompt_texts")  # by text where both know the prompts' texts
        texts = [k for k in made["prompts"].get("keys") or () if not k.startswith(ID_KEY)]  # (not ids alone)
        if over is not None and texts and over != made["prompts"]["digest"]:
            raise DataError(f"--weights {args.weights}: made over other calibration prompts than --scores "
                            f"{args.scores} (prompt-set digest {over}, the scores' {made['prompts']['digest']}): "
                            "weights of another calibration set")
        made |= {k: v for k, v in (("weighted", True), ("scenario", shift["scenario"]), ("ess", shift["ess"]),
                                   ("stream", weights_made.get("stream")),
                                   ("min_ess", shift["min_ess"])) if v is not None}
        log.info("covariate-shift weights %s: effective sample size %.1f of %d calibration prompts (min_ess %g)%s",
                 args.weights, shift["ess"], shift["n"], shift["min_ess"],
                 " (all equal: the plain calibration)" if shift["equal"] else "")
    try:
        result = calibrate(scores, s, weights, None if shift is None else shift["min_ess"])
    except ValueError as exc:
        raise DataError(f"{args.scores}: {exc}") from None
    if shift is not None:
        result["weights"] = {k: shift[k] for k in ("path", "sha256", "ess", "min_ess", "n", "scenario")}
        made["certified"] = result["certified"]
        if not result["certified"]:
            log.warning("weighted lambda NOT certified: effective sample size %.1f < min_ess %g; the record is "
                        "written for the report, and read_lambda refuses it to every decoder", shift["ess"],
                        shift["min_ess"])
    check_clipping(result, s, args.allow_clipping, args.scores)
    made["decoder"] = result["decoder"]
    lo, hi = result["cost_range"]
    if not result["feasible"]:
        msg = (f"tau={s.tau} is not reachable within [0, lambda_search_max={s.lambda_search_max}]: the mean cost under "
               f"pi*_lambda ranges over [{lo:.6g}, {hi:.6g}] (lambda = lambda_search_max .. 0)")
        if result["status"] != "infeasible":  # the estimate reaches tau; the deployed guarantee does not
            msg = (f"calibration.guarantee {s.guarantee} cannot certify tau={s.tau} within [0, lambda_search_max="
                   f"{s.lambda_search_max}] with {result['n_prompts']:,} calibration prompts and cost_bounds "
                   f"{s.cost_bounds}" + (f" at delta {s.delta}" if s.guarantee in ("ltt", "ltt_wsr") else "")
                   + " (more prompts, tighter fixed bounds, or a larger tau)")
        check_feasible(msg, args.allow_infeasible, args.scores)
    result |= provenance(s, args.scores, identity=made)
    write_lambda(result, args.out)
    b = result["bootstrap"]
    log.info("decoder %s: expected cost %.6g at lambda_hat, %.6g at lambda_star (tau %g)", result["decoder"],
             result["decoder_cost_at_lambda_hat"], result["decoder_cost_at_lambda_star"], s.tau)
    log.info("lambda_hat=%.8f (%s), bootstrap lambda*=%.8f (q%.3g of %d replicates; mean %.6f, std %.6f), "
             "cost range [%.4g, %.4g]; solve %.3f s, bootstrap %.3f s, certified %.3f s", result["lambda_hat"],
             result["status"], result["procedures"]["bootstrap"]["lambda"], s.quantile, s.bootstrap, b["mean"],
             b["std"], lo, hi, result["timing_s"]["solve"], result["timing_s"]["bootstrap"],
             result["timing_s"]["certified"])
    for name, proc in result["procedures"].items():
        log.info("%s: lambda %.8f%s", name, proc["lambda"], " (deployed as lambda_star)" if name == s.guarantee else "")
    log.info("guarantee: %s", result["guarantee"]["statement"])
    if result["guarantee"]["clipped_fraction"]:
        log.info("cost_bounds %s clip %s of the calibration costs", s.cost_bounds,
                 result["guarantee"]["clipped_fraction"])
