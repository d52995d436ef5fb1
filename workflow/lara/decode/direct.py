"""``lara calibrate-decoder``: a lambda calibrated for a token-level decoder itself (``calibration.token_level:
direct``), instead of reusing Best-of-N's lambda* (the paper's heuristic); docs/calibration.md states the search and
what it promises.

The decoder (ARGS, PARGS or CD-Q, with its own scorers and settings) decodes the calibration prompts at a lambda; the
decoding reward and cost models (the full-sequence models, tau's units, as the constraint audit uses them) score the
responses. :func:`search` scans lambda = 0 and then ``decode.lambda_grid`` upwards to the first that meets tau,
bisects the bracket ``refine_steps`` times (its left end always measured above tau, its right end at or below it)
and deploys the right end: a lambda whose own decode met tau, never an interpolation, since a token-level decoder's
cost need not be monotone in lambda. If no grid lambda meets tau the record says ``infeasible`` and deploys the
largest grid lambda (the audit then shows how far it stays above tau). The record (``direct_<method>.json``) holds
the deployed ``lambda_star``, tau, the status, the final bracket, the number of decodes and every evaluation (mean
cost with its bootstrap 95 % interval, mean reward).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import ClassVar

from lara.calibrate.record import DIRECT_KIND as KIND  # the record type; lara.calibrate.record reads it
from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting

log = logging.getLogger(__name__)

HELP = "calibrate lambda for a token-level decoder itself: decode the calibration prompts, score, search"


@dataclass(frozen=True)
class DirectSettings(Settings):
    """What the decoder-matched search reads from the config (the decoder's own settings come separately,
    as ``--decoder-settings``: the decode.rgtg.METHOD section that decoding uses)."""

    SECTION: ClassVar[str] = ""

    tau: float = setting(help="The cost budget the decoder's mean calibration cost must meet.", key="calibration.tau")
    lambda_grid: list[float] = setting(help="The lambdas scanned upwards (after 0) for the first that meets tau.",
                                       minimum=0, key="decode.lambda_grid")
    refine_steps: int = setting(help="Bisections inside the bracket the scan ends in.", minimum=0,
                                key="calibration.direct_refine_steps")
    bootstrap: int = setting(2000, "Bootstrap replicates over prompts of each evaluation's interval.", minimum=1,
                             key="evaluation.bootstrap")
    seed: int = seed_setting()


def search(evaluate, grid, tau: float, refine_steps: int) -> dict:
    """The scan-then-bisect search of the module docstring over ``evaluate(lam) -> {"mean_cost": ...}``
    (called once per distinct lambda). Returns the deployed lambda, status, bracket and evaluations."""
    evals: dict[float, dict] = {}

    def at(lam: float) -> dict:
        if lam not in evals:
            evals[lam] = evaluate(lam)
            log.info("lambda %.6g: mean cost %.4f (tau %.4g)%s", lam, evals[lam]["mean_cost"], tau,
                     " meets tau" if evals[lam]["mean_cost"] <= tau else "")
        return evals[lam]

    points = sorted({0.0, *(float(x) for x in grid)})
    below, first = None, None
    for lam in points:
        if at(lam)["mean_cost"] <= tau:
            first = lam
            break
        below = lam
    if first is None:
        status, deployed, bracket = "infeasible", points[-1], [points[-1], None]
    elif below is None:
        status, deployed, bracket = "unconstrained", first, [None, first]
    else:
        lo, hi = below, first
        for _ in range(refine_steps):
            mid = (lo + hi) / 2
            if at(mid)["mean_cost"] <= tau:
                hi = mid
            else:
                lo = mid
        status, deployed, bracket = "feasible", hi, [lo, hi]
    return {"lambda_star": deployed, "status": status, "bracket": bracket, "n_decodes": len(evals),
            "evaluations": [{"lambda": lam, **evals[lam]} for lam in sorted(evals)]}


def add_arguments(parser) -> None:
    from lara.decode.rgtg import add_decoder_arguments

    add_decoder_arguments(parser)
    parser.add_argument("--decoder-reward", required=True, help="the decoding reward model (full sequences)")
    parser.add_argument("--decoder-cost", required=True, help="the decoding cost model (full sequences, tau's units)")
    parser.add_argument("--prompts", required=True, help="the calibration prompts (prompt_id, prompt)")
    parser.add_argument("--decoder-settings", required=True,
                        help="JSON of the decoder's settings (decode.rgtg.METHOD, as `lara rgtg --settings` takes)")
    parser.add_argument("--heuristic-lambda-json", default=None,
                        help="the Best-of-N lambda.json whose lambda* the paper reuses: recorded beside the result")
    add_settings_arguments(parser, DirectSettings, section_help="JSON of the search's settings (keys below)")
    parser.add_argument("--out", required=True, help="direct_<method>.json")


OUTPUTS = ("out",)


def run(args) -> None:
    import numpy as np

    from lara import identity
    from lara.calibrate.record import read_lambda
    from lara.config import require_model
    from lara.decode.rgtg import METHOD_SETTINGS, decode, load_models
    from lara.io import atomic_output, write_json
    from lara.read.files import DataError, read_table
    from lara.scoring import load_scorer
    from lara.stats import cost_audit

    s = read_settings(args, DirectSettings)
    role = identity.expect_role(args.prompts, "--prompts", "calibration",  # (before any decode)
                                "a lambda calibrated on the prompts the audit holds out makes the audit in-sample")
    ds = METHOD_SETTINGS[args.method].from_json(args.decoder_settings, origin="--decoder-settings")
    # decode.lambda_grid checked here as the sweeps check it (decode.sweep.finite_grid), not imported from them: a
    # token-level decode's code hash holds no Best-of-N module (tests/unit/test_codehash.py)
    grid = [float(x) for x in s.lambda_grid]
    if not grid or not all(math.isfinite(x) for x in grid):
        from lara.config import ConfigError

        raise ConfigError(f"decode.lambda_grid {s.lambda_grid!r}: lambda values must be finite, at least one")
    heuristic = read_lambda(args.heuristic_lambda_json) if args.heuristic_lambda_json else None
    df = read_table(args.prompts, required=("prompt_id", "prompt"))
    prompt_set = identity.prompt_set(df, f"--prompts {args.prompts}", per_prompt=1)
    for flag, spec in (("--policy", args.policy), ("--reward", args.reward), ("--cost", args.cost),
                       ("--decoder-reward", args.decoder_reward), ("--decoder-cost", args.decoder_cost)):
        require_model(spec, flag)
    tok, pm, rm, cm = load_models(args.method, args.policy, args.reward, args.cost, ds.dtype)
    judge_r = load_scorer(args.decoder_reward, role="reward", dtype=ds.dtype)
    judge_c = load_scorer(args.decoder_cost, role="cost", dtype=ds.dtype)
    prompts = df["prompt"].tolist()
    t0 = time.perf_counter()

    def evaluate(lam: float) -> dict:
        tokens = decode(pm, rm, cm, tok, prompts, lam, ds, ds.seed)
        responses = [tok.decode(t, skip_special_tokens=True).strip() for t in tokens]
        cost = judge_c.score(prompts, responses)
        reward = judge_r.score(prompts, responses)
        if not (np.all(np.isfinite(cost)) and np.all(np.isfinite(reward))):
            raise DataError(f"{args.decoder_cost}: non-finite scores of the {args.method} responses at lambda {lam}")
        row = cost_audit(cost, s.tau, s.bootstrap, s.seed, reward)
        return {k: row[k] for k in ("mean_cost", "ci95", "verdict", "mean_reward")}

    found = search(evaluate, grid, s.tau, s.refine_steps)
    record = {"kind": KIND, "method": args.method, "tau": s.tau, **found, "n_prompts": len(df),
              "search": "scan 0 and decode.lambda_grid upwards to the first lambda that meets tau, then bisect "
                        "the bracket; deploys a lambda whose own decode met tau (lara.decode.direct)",
              "decoder_settings": ds.section(), "prompts": args.prompts,
              "heuristic": None if heuristic is None else {"lambda_star": heuristic.lambda_star,
                                                            "lambda_json": args.heuristic_lambda_json,
                                                            "calibrated_for": heuristic.decoder},
              identity.KEY: identity.stamp(KIND, args.out, role=role, tau=s.tau,
                                           prompts=prompt_set.record(with_keys=True),
                                           made_from={"--prompts": args.prompts,
                                                      "--heuristic-lambda-json": args.heuristic_lambda_json})}
    with atomic_output(args.out) as tmp:
        write_json(tmp, record)
    log.info("%s: lambda %.6g (%s) after %d decodes of %d calibration prompts in %.1f s%s", args.method,
             found["lambda_star"], found["status"], found["n_decodes"], len(df), time.perf_counter() - t0,
             "" if heuristic is None else f"; the heuristic (Best-of-N's lambda*) is {heuristic.lambda_star:.6g}")
