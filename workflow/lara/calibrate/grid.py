"""The commands of a decoder calibrated on a lambda grid, written once for every such decoder: its record
(``lara calibrate-prune``) and its coverage study (``lara coverage-prune``). A command module binds a settings class
and a reader of its input table (``from_table(path, settings, where)``: the decoder, the prompt ids, the costs (P, K)
and the table); everything else — roles, floors, the record, its identity, the logs — is here and in
:mod:`lara.calibrate.procedures`."""

from __future__ import annotations

import logging
from dataclasses import asdict

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)


def require_enabled(s, what: str) -> None:
    """A settings class with a pruned schedule (``enabled``) and none set: refused, there is nothing to ``what``."""
    from lara.settings import ConfigError

    if not getattr(s, "enabled", True):
        raise ConfigError(f"decode.bon_prune.checkpoints is empty: there is no pruned decoder to {what}")


def calibrate_command(args, cls, from_table, scorers: tuple[str, ...] = ()) -> None:
    """``--scores`` (the calibration samples) -> the decoder's record at ``--out``."""
    from lara import identity
    from lara.calibrate import procedures
    from lara.calibrate.record import provenance, write_lambda
    from lara.settings import read_settings

    s = read_settings(args, cls)
    require_enabled(s, "calibrate")
    where = f"--scores {args.scores}"
    found = identity.read_identity(args.scores)
    role = identity.expect_role(args.scores, "--scores", "calibration", "the samples of the calibration prompts: "
                                "calibrating on the prompts the audit holds out makes the audit in-sample", found)
    decoder, ids, cost, df = from_table(args.scores, s, "--scores")
    prompts = identity.prompt_set(df, where)
    log.info("%d prompts x %d samples; %s; grid of %d lambdas on [0, %g]", len(ids), cost.shape[1],
             decoder.describe(), s.grid_points, s.lambda_search_max)
    result = procedures.calibrate(decoder, s, cost, where)
    procedures.check_clipping(result, s, False, where)
    if not result["feasible"]:
        msg = (f"{decoder.describe()}: the {s.guarantee} lambda reaches tau = {s.tau} at no grid lambda in [0, "
               f"{s.lambda_search_max}] (calibration mean cost {result['curves']['mean_cost'][-1]:.6g} at the end)")
        procedures.check_feasible(msg, args.allow_infeasible, where)
    made = identity.stamp("lambda", args.out, role=role, tau=s.tau, mode=decoder.mode, procedure=s.guarantee,
                          prompts=prompts.record(with_keys=True), decoder=result["decoder"],
                          **identity.inherit(found, "reward_scorer", "cost_scorer", *scorers),
                          made_from={"--scores": args.scores})
    result |= provenance(s, args.scores, identity=made)
    write_lambda(result, args.out)
    log.info("lambda_hat %.6g (%s), lambda* %.6g (%s); calibration mean cost %.4f at lambda*, tau %g",
             result["lambda_hat"], result["status"], result["lambda_star"], s.guarantee,
             result["decoder_cost_at_lambda_star"], s.tau)
    for name, p in result["procedures"].items():
        log.info("%s: lambda %.6g, feasible %s, mean cost %.4f, reward %.4f, %.1f tokens per prompt", name, p["lambda"],
                 p["feasible"], p["mean_cost"], p["mean_reward"], p["mean_tokens"])
    log.info("tokens per prompt: full Best-of-%d %.1f, %s at lambda* %.1f (ratio %.2f); cost curve %s in lambda",
             s.n, result["tokens"]["full_best_of_n"], decoder.describe(),
             result["tokens"]["at_lambda_star"], result["tokens"]["ratio_at_lambda_star"],
             "monotone" if result["monotone"] else "NOT monotone")
    log.info("guarantee: %s", result["guarantee"]["statement"])
    if "ties" in result:
        log.info("ties at the keep cuts (rule %s): %.1f%% of the cuts at lambda* fell between candidates whose "
                 "prefixes score and cost the same", result["ties"]["rule"],
                 100 * result["ties"]["tied_cut_share_at_lambda_star"])
    if s.cost_bounds is None:
        log.info("no certified lambdas: calibration.cost_bounds is null")


def coverage_command(args, cls, from_table, kind: str) -> None:
    """``--scores`` (tables whose prompts together are the population) -> the coverage study at ``--out`` (JSON)
    and ``--table`` (CSV): every procedure held to its promise on repeated draws."""
    from lara import identity
    from lara.calibrate.decoder import Curves
    from lara.calibrate.procedures import check_floors, check_sizes, study
    from lara.io import write_json
    from lara.read.files import DataError, write_table
    from lara.settings import ConfigError, read_settings

    s = read_settings(args, cls)
    require_enabled(s, "study")
    if s.cost_bounds is None:
        raise ConfigError("calibration.cost_bounds is null: the coverage study holds CRC and LTT to their promises, "
                          "which need fixed bounds")
    check_sizes(s.n_prompts)
    grid = np.linspace(0.0, s.lambda_search_max, s.grid_points)
    parts, seen, decoder, sets = [], set(), None, {}
    for path in args.scores:
        decoder, ids, cost, df = from_table(path, s, "--scores")
        sets[str(path)] = identity.prompt_set(df, f"--scores {path}")
        twice = seen & set(map(str, ids))
        if twice:
            raise DataError(f"--scores {path}: prompt {sorted(twice)[0]!r} is in another table too: each population "
                            "prompt once")
        seen |= set(map(str, ids))
        c = decoder.curves(grid, s.cost_bounds)
        check_floors(len(ids), cost.shape[1], c, decoder, f"--scores {path}")
        parts.append(c)
    identity.distinct_pools(sets)
    pop = Curves.stack(parts)
    log.info("population: %d prompts; %s; %d repeats per size %s", pop.n_prompts, decoder.describe(), s.repeats,
             s.n_prompts)
    rows, facts = study(pop, s, s.tau)
    for r in rows:
        log.info("n=%-4d %-9s certified %.2f violations %d/%d (%.3f [%.3f, %.3f]) mean cost %s", r["n_prompts"],
                 r["procedure"], r["certified_share"], r["violations"], r["repeats"], r["violation_rate"],
                 r["violation_lo"], r["violation_hi"], r["mean_population_cost"])
    write_table(pd.DataFrame(rows), args.table)
    about = {k: v for k, v in decoder.identity().items() if k != "k"}  # the population's K may differ per table
    write_json(args.out, {"rows": rows, "population": facts, "settings": asdict(s), "tau": s.tau, "delta": s.delta,
                          "decoder": about, **({"schedule": about["schedule"]} if "schedule" in about else {}),
                          identity.KEY: identity.stamp(kind, args.out, decoder=about,
                                                       made_from={f"--scores {i}": p
                                                                  for i, p in enumerate(args.scores)})})
