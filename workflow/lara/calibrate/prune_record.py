"""``lara calibrate-prune``: lambda for the pruned Best-of-N decoder itself (``decode.bon_prune``), from the calibration
samples and their prefix scores (``lara score-prefixes``), written as a lambda record (``lambda_bon_prune.json``)
that the decoder's hat, star, crc, ltt and ltt_wsr settings read. The method is :mod:`lara.calibrate.pruned`'s: the
decoder's expected cost per prompt on a lambda grid, the stable root, a prompt bootstrap, and the certificates
(fixed-sequence LTT; CRC on each prompt's upper envelope). Full Best-of-N's lambda is never reused: the record
names the pruned decoder and its schedule, and ``lara select-bon-prune`` refuses any other record.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict

import numpy as np

from lara.decode.prune import PruneSettings
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)

HELP = "calibrate lambda for the pruned Best-of-N decoder itself (decode.bon_prune) on the calibration samples"
KIND = "pruned_best_of_n"
QUANTILES = (0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.975)
STATUS = {0: "found", 1: "inactive", 2: "infeasible"}
MAX_CLIPPED = 0.01  # as lara calibrate: the largest share of calibration costs the bounds may clip for a certificate


def add_arguments(parser) -> None:
    parser.add_argument("--scores", required=True, help="the calibration samples with their prefix scores "
                                                        "(lara score-prefixes)")
    add_settings_arguments(parser, PruneSettings)
    parser.add_argument("--allow-infeasible", action="store_true",
                        help="write the record when the deployed procedure cannot reach tau (feasible: false)")
    parser.add_argument("--out", required=True, help="the record (lambda_bon_prune.json)")


def statement(procedure: str, lam: float, s: PruneSettings, schedule, n_prompts: int, feasible: bool,
              exact: bool, n_subsets: int) -> str:
    """The guarantee of one procedure's lambda for the pruned decoder, in one sentence."""
    decoder = schedule.describe()
    draws = ("exact over every N-subset of each prompt's K samples" if exact else
             f"over {n_subsets} random N-subsets per prompt (an unbiased estimate)")
    if not feasible:
        return (f"no guarantee: {procedure} reached tau = {s.tau:g} at no lambda of the grid on [0, "
                f"{s.lambda_search_max:g}] with {n_prompts:,} calibration prompts")
    clip = "" if s.cost_bounds is None else f" (costs clipped to [{s.cost_bounds[0]:g}, {s.cost_bounds[1]:g}])"
    if procedure in ("ltt", "ltt_wsr"):
        p = "Hoeffding-Bentkus" if procedure == "ltt" else "betting (Waudby-Smith & Ramdas 2024)"
        return (f"with probability >= {1 - s.delta:.3g} over the draw of the {n_prompts:,} calibration prompts, "
                f"{decoder} at lambda = {lam:.6g} has expected cost{clip} <= tau = {s.tau:g} on prompts from the same "
                f"distribution (Learn then Test, {p} p-values, fixed-sequence testing down a {s.grid_points}-point "
                f"grid, valid without monotonicity; losses {draws}; the partial and full scorers fixed)")
    if procedure == "crc":
        return (f"averaged over the draw of the {n_prompts:,} calibration prompts and a new prompt, {decoder} at "
                f"lambda = {lam:.6g} has expected cost{clip} <= tau = {s.tau:g} (conformal risk control on each "
                f"prompt's upper envelope max over lambda' >= lambda of its loss, which makes it monotone; losses "
                f"{draws})")
    return (f"no finite-sample guarantee: lambda* = {lam:.6g} is the {s.quantile:g} quantile (a grid point, rounded "
            f"up) of {s.bootstrap:,} bootstrap replicates of lambda-hat for {decoder} over the {n_prompts:,} "
            f"calibration prompts (losses {draws})")


def calibrate(ps, s: PruneSettings) -> dict:
    """The record's content (everything but settings, inputs and identity)."""
    from lara.calibrate import pruned

    schedule = s.schedule()
    t0 = time.perf_counter()
    grid = np.linspace(0.0, s.lambda_search_max, s.grid_points)
    curves = pruned.curves(ps, schedule, grid, s.cost_bounds, s.max_subsets, s.seed)
    t1 = time.perf_counter()
    n = ps.shape[0]
    hat = pruned.hat(curves, s.tau)
    boot_idx, boot_status = pruned.bootstrap_roots(curves.cost, s.tau, s.bootstrap, s.seed)
    boot = grid[boot_idx]
    star_idx = int(np.quantile(boot_idx, s.quantile, method="higher"))
    t2 = time.perf_counter()
    procedures = {"bootstrap": {"lambda": float(grid[star_idx]), "feasible": hat.feasible, "index": star_idx}}
    if s.cost_bounds is not None:
        for name, search in (("crc", pruned.crc(curves, s.tau, s.cost_bounds)),
                             ("ltt", pruned.ltt(curves, s.tau, s.delta, s.cost_bounds, "hb")),
                             ("ltt_wsr", pruned.ltt(curves, s.tau, s.delta, s.cost_bounds, "wsr", s.seed))):
            procedures[name] = {"lambda": search.lam(grid), "feasible": search.feasible, "index": search.index}
    t3 = time.perf_counter()
    for name, p in procedures.items():
        p["statement"] = statement(name, p["lambda"], s, schedule, n, p["feasible"], curves.exact, curves.n_subsets)
        i = p.pop("index")
        p |= at_index(curves, i)
    deployed = procedures[s.guarantee]
    full_tokens = float(ps.length.mean(axis=1).mean() * schedule.n)  # full Best-of-N on an N-subset, on average
    quantiles = {str(q): float(grid[int(np.quantile(boot_idx, q, method="higher"))])
                 for q in sorted({*QUANTILES, s.quantile})}
    clipped = None
    if s.cost_bounds is not None:
        lo, hi = s.cost_bounds
        clipped = {"below": float((ps.cost < lo).mean()), "above": float((ps.cost > hi).mean())}
    hist, edges = np.histogram(boot, bins=50)
    return {
        "lambda_hat": hat.lam(grid),
        "lambda_star": deployed["lambda"],
        "guarantee": {"procedure": s.guarantee, "delta": s.delta if s.guarantee in ("ltt", "ltt_wsr") else None,
                      "cost_bounds": s.cost_bounds, "clipped_fraction": clipped, "feasible": deployed["feasible"],
                      "statement": deployed["statement"]},
        "procedures": procedures,
        "decoder": {"kind": KIND, "n": schedule.n, "k": int(ps.shape[1]), "schedule": schedule.as_dict()},
        "decoder_cost_at_lambda_hat": float(curves.cost[:, hat.index].mean()),
        "decoder_cost_at_lambda_star": deployed["mean_cost"],
        "status": STATUS[hat.status],
        "feasible": hat.feasible and deployed["feasible"],
        "subsets": {"exact": curves.exact, "count": curves.n_subsets,
                    "max_standard_error": float(curves.cost_se.mean(axis=0).max())},
        "tokens": {"full_best_of_n": full_tokens, "at_lambda_star": deployed["mean_tokens"],
                   "ratio_at_lambda_star": full_tokens / deployed["mean_tokens"]},
        "bootstrap": {"replicates": s.bootstrap, "quantile": s.quantile, "mean": float(boot.mean()),
                      "std": float(boot.std(ddof=1)) if len(boot) > 1 else 0.0, "quantiles": quantiles,
                      "n_inactive": int((boot_status == 1).sum()), "n_infeasible": int((boot_status == 2).sum()),
                      "histogram": {"counts": hist.tolist(), "edges": edges.tolist()}},
        "tau": s.tau,
        "lambda_search_max": s.lambda_search_max,
        "mode": "bon_prune",
        "seed": s.seed,
        "n_prompts": int(n),
        "samples_per_prompt": {"min": int(ps.shape[1]), "max": int(ps.shape[1]), "mean": float(ps.shape[1]),
                               "total": int(ps.shape[0] * ps.shape[1])},
        "monotone": bool((np.diff(curves.cost.mean(axis=0)) <= 1e-12).all()),
        "curves": {"lambda": grid.tolist(), "mean_cost": curves.cost.mean(axis=0).tolist(),
                   "mean_reward": curves.reward.mean(axis=0).tolist(),
                   "mean_tokens": curves.tokens.mean(axis=0).tolist()},
        "timing_s": {"curves": t1 - t0, "bootstrap": t2 - t1, "certified": t3 - t2},
    }


def at_index(curves, i: int) -> dict:
    """The decoder's calibration-set means at grid point ``i``."""
    return {"mean_cost": float(curves.cost[:, i].mean()), "mean_reward": float(curves.reward[:, i].mean()),
            "mean_tokens": float(curves.tokens[:, i].mean())}


def run(args) -> None:
    from lara import identity
    from lara.calibrate.record import write_lambda
    from lara.decode.prune import read_prefix_scores
    from lara.io import sha256_file
    from lara.provenance import code_version
    from lara.read.files import DataError
    from lara.settings import ConfigError

    s = read_settings(args, PruneSettings)
    if not s.enabled:
        raise ConfigError("decode.bon_prune.checkpoints is empty: there is no pruned decoder to calibrate")
    schedule = s.schedule()
    role = identity.expect_role(args.scores, "--scores", "calibration", "the samples of the calibration prompts: "
                                "calibrating on the prompts the audit holds out makes the audit in-sample")
    _, ps, _, df = read_prefix_scores(args.scores, schedule, "--scores", s.max_new_tokens)
    if ps.shape[1] < schedule.n:
        raise DataError(f"--scores {args.scores}: K = {ps.shape[1]} samples per prompt, fewer than the decoder's "
                        f"N = {schedule.n} (decode.bon_n)")
    prompts = identity.prompt_set(df, f"--scores {args.scores}")
    log.info("%d prompts x %d samples; %s; grid of %d lambdas on [0, %g]", ps.shape[0], ps.shape[1],
             schedule.describe(), s.grid_points, s.lambda_search_max)
    result = calibrate(ps, s)
    clipped = result["guarantee"]["clipped_fraction"]
    share = 0.0 if not clipped else clipped["below"] + clipped["above"]
    if s.guarantee != "bootstrap" and share > MAX_CLIPPED:
        raise DataError(f"--scores {args.scores}: calibration.guarantee {s.guarantee}: calibration.cost_bounds "
                        f"{s.cost_bounds} clip {share:.1%} of the calibration costs (more than {MAX_CLIPPED:.0%}): the "
                        "certificate would be about a cost the model rarely gives; widen the bounds (fixed before "
                        "seeing these costs)")
    if not result["feasible"]:
        msg = (f"the pruned decoder's {s.guarantee} lambda reaches tau = {s.tau} at no grid lambda in [0, "
               f"{s.lambda_search_max}] (calibration mean cost {result['curves']['mean_cost'][-1]:.6g} at the end)")
        if not args.allow_infeasible:
            raise DataError(f"--scores {args.scores}: {msg}; raise calibration.lambda_search_max or tau, or pass "
                            "--allow-infeasible")
        log.warning("%s; writing it with feasible=false", msg)
    made = identity.stamp("lambda", args.out, role=role, tau=s.tau, mode="bon_prune", procedure=s.guarantee,
                          prompts=prompts.record(with_keys=True), decoder=result["decoder"],
                          **identity.inherit(identity.read_identity(args.scores), "reward_scorer", "cost_scorer"),
                          made_from={"--scores": args.scores})
    result |= {"settings": asdict(s), "scores": {"path": str(args.scores), "sha256": sha256_file(args.scores)},
               "code": code_version(), "identity": made}
    write_lambda(result, args.out)
    log.info("lambda_hat %.6g (%s), lambda* %.6g (%s); calibration mean cost %.4f at lambda*, tau %g",
             result["lambda_hat"], result["status"], result["lambda_star"], s.guarantee,
             result["decoder_cost_at_lambda_star"], s.tau)
    for name, p in result["procedures"].items():
        log.info("%s: lambda %.6g, feasible %s, mean cost %.4f, reward %.4f, %.1f tokens per prompt", name, p["lambda"],
                 p["feasible"], p["mean_cost"], p["mean_reward"], p["mean_tokens"])
    log.info("tokens per prompt: full Best-of-%d %.1f, pruned at lambda* %.1f (ratio %.2f); cost curve %s in lambda",
             schedule.n, result["tokens"]["full_best_of_n"], result["tokens"]["at_lambda_star"],
             result["tokens"]["ratio_at_lambda_star"], "monotone" if result["monotone"] else "NOT monotone")
    log.info("guarantee: %s", result["guarantee"]["statement"])
    if s.cost_bounds is None:
        log.info("no certified lambdas: calibration.cost_bounds is null")
