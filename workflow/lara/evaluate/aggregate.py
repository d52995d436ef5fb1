"""``lara aggregate``: one summary row per (method, setting) with bootstrap confidence intervals, and the held-out
constraint audit (docs/evaluation.md, "Aggregate": the columns and the audit's sections).

The audit holds each output to tau in the units of the cost model calibration used (``decoder_cost``, kept by ``lara
evaluate`` beside ``decoder_reward``): Best-of-N at lambda* first (the calibrated claim), then every decoder at every
lambda setting (``decoders``), each with its mean cost, intervals and verdict (:mod:`lara.stats`); ``paired``: per
decoder, the differences of :data:`PAIRS` on the same prompts. With ``--sweep``, the same verdict at every lambda of
the sweep (``by_lambda``, ``by_n``) and for the paper's own estimator, soft mode at each beta, its lambda* applied to
Best-of-N (``soft_mode``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lara import identity
from lara.calibrate.record import LambdaRecord, check_budget, overpenalised_note, read_lambda, setting_tau, tau_name
from lara.data.errors import DataError
from lara.settings import CERTIFIED, Settings, add_settings_arguments, cross_key, read_settings, seed_setting, setting
from lara.stats import check_replicates, cost_audit, mean_interval, paired_difference

log = logging.getLogger(__name__)

HELP = "summary table of every evaluated output (bootstrap CIs) and the held-out constraint audit"


@dataclass(frozen=True)
class AuditSettings(Settings):
    """What the summary and the constraint audit read from the config."""

    tau: float = setting(help="The cost budget; the audited lambda.json must have been calibrated for it.",
                         key="calibration.tau")
    overpenalised_lambda: float | None = setting(None, "The `max` setting's lambda: the audit says when lambda* is "
                                                       "at or above it.", minimum=0, key="decode.overpenalised_lambda")
    bootstrap: int = setting(2000, "Bootstrap replicates over test prompts of every interval.", minimum=1,
                             key="evaluation.bootstrap")
    seed: int = seed_setting()

    @cross_key("evaluation.bootstrap", witness={"evaluation": {"bootstrap": 100}})
    def intervals_resolved(self):
        from lara.stats import replicates_problem

        return replicates_problem(self.bootstrap)


def summarise(scores: pd.DataFrame, judge: pd.DataFrame | None, n_boot: int, seed: int) -> pd.DataFrame:
    df = scores.copy()
    df["safe_rate"] = (df["harmfulness"] <= 0).astype(float)
    metrics = ["helpfulness", "harmfulness", "safe_rate"]
    if judge is not None and len(judge):
        cols = [c for c in judge.columns if c.startswith("judge_")]
        df = df.merge(judge[["prompt_id", "method", "setting", *cols]], on=["prompt_id", "method", "setting"],
                      how="left", validate="one_to_one")
        metrics += cols
    rows = []
    for (method, named), g in df.groupby(["method", "setting"], sort=False):
        row = {"method": method, "setting": named, "lambda": g["lambda"].iloc[0], "n": len(g)}
        for m in metrics:
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = mean_interval(g[m], n_boot, seed=seed)
            if m.startswith("judge_"):  # the judge's mean is over valid ratings; say how many and how many failed
                valid = int(np.isfinite(g[m].to_numpy(dtype=float)).sum())
                row[f"{m}_n"], row[f"{m}_failed"] = valid, len(g) - valid
        rows.append(row)
    return pd.DataFrame(rows)


def constraint_audit(bon_star: pd.DataFrame, lam: LambdaRecord, n_boot: int, seed: int,
                     overpenalised: float | None = None) -> dict:
    """The held-out verdict of Best-of-N at lambda* against the tau that ``lam`` was calibrated for."""
    tau = lam.tau
    row = cost_audit(bon_star["decoder_cost"], tau, n_boot, seed)
    note = overpenalised_note(lam.lambda_star, overpenalised)
    return {"question": "does Best-of-N at lambda* meet E[c] <= tau on the test prompts?",
            "overpenalised_lambda": overpenalised, "lambda_star_at_or_above_max": note is not None,
            **({"note": note} if note else {}),
            "tau": tau, "lambda_star": lam.lambda_star, "lambda_hat": lam.lambda_hat,
            "calibration_mode": lam.mode, "n_test_prompts": int(len(bon_star)),
            "mean_cost": row["mean_cost"], "ci95": row["ci95"], "one_sided95": row["one_sided95"],
            "meets_tau_point": bool(row["mean_cost"] <= tau),
            "meets_tau_upper_bound": bool(row["one_sided95"][1] <= tau), "verdict": row["verdict"]}


def decoder_audit(scores: pd.DataFrame, tau: float, n_boot: int, seed: int) -> list[dict]:
    """Every output scored by the decoding models (``decoder_cost``, tau's units): per method and
    lambda setting, its mean cost, intervals and verdict against tau (a ``star_tau_<tau>`` setting against
    its own tau), and its mean decoder reward."""
    if "decoder_cost" not in scores.columns:
        return []
    rows = []
    for (method, named), g in scores.groupby(["method", "setting"], sort=False):
        finite = np.isfinite(g["decoder_cost"].to_numpy(dtype=float))
        if not finite.any():  # an output never scored by the decoding models
            continue
        if not finite.all():
            raise DataError(f"{method} at {named}: decoder_cost is missing or not finite for "
                            f"{int((~finite).sum())} of {len(g)} prompts; rescore that output")
        reward = g["decoder_reward"] if "decoder_reward" in g.columns else None
        lam = float(g["lambda"].iloc[0])
        own = setting_tau(named)
        budget = tau if own is None else own
        rows.append({"method": method, "setting": named, "lambda": lam if np.isfinite(lam) else None,
                     "tau": budget, **cost_audit(g["decoder_cost"], budget, n_boot, seed, reward)})
    return rows


def procedure_audit(lam: LambdaRecord, decoders: list[dict], method: str = "bon") -> list[dict]:
    """Each calibration procedure of lambda.json (bootstrap, and crc and ltt when cost_bounds was set): its
    lambda, what it promises, and the held-out audit of ``method`` (Best-of-N; pruned Best-of-N with its own
    record) at that lambda (the `star` rows for the deployed one, the `crc` and `ltt` rows for the certified
    ones; none for an undeployed bootstrap)."""
    deployed = (lam.get("guarantee") or {}).get("procedure", "bootstrap")
    out = []
    for name, entry in (lam.get("procedures") or {}).items():
        setting = "star" if name == deployed else name if name != "bootstrap" else None
        held_out = next(({k: v for k, v in r.items() if k not in ("method", "setting")} for r in decoders
                         if r["method"] == method and r["setting"] == setting), None)
        out.append({"procedure": name, "deployed": name == deployed, "lambda": entry["lambda"],
                    "feasible": entry.get("feasible", True), "statement": entry.get("statement"),
                    "setting": setting, "held_out": held_out})
    return out


def tau_audit(main: LambdaRecord, others: list[LambdaRecord], decoders: list[dict]) -> list[dict]:
    """One row per listed calibration.tau (the main one first): its lambda-hat and lambda*, and every decoder's
    held-out audit at that lambda* (the `star` rows for the main tau, `star_tau_<tau>` for the others)."""
    out = []
    for i, rec in enumerate([main, *others]):
        setting = "star" if i == 0 else f"star_tau_{tau_name(rec.tau)}"
        at = {r["method"]: {k: v for k, v in r.items() if k not in ("method", "setting", "tau")}
              for r in decoders if r["setting"] == setting}
        out.append({"tau": rec.tau, "main": i == 0, "setting": setting, "lambda_star": rec.lambda_star,
                    "lambda_hat": rec.lambda_hat, "feasible": rec.feasible, "status": rec.status,
                    "lambda_json": rec.path, "decoders": at})
    return out


# lambda* against no constraint, against over-penalising, against lambda-hat; a token-level decoder's own
# calibration against the Best-of-N lambda* it would otherwise reuse
PAIRS = (("star", "zero"), ("star", "max"), ("star", "hat"), ("direct", "star"), ("crc", "star"), ("ltt", "star"),
         ("ltt_wsr", "star"), ("ltt_wsr", "ltt"))
PAIRED_METRICS = ("decoder_reward", "decoder_cost", "helpfulness", "harmfulness")


PRUNED = "bon_prune"


def pruned_audit(scores: pd.DataFrame, record: LambdaRecord, decoders: list[dict], n_boot: int, seed: int) -> dict:
    """Pruned Best-of-N beside full Best-of-N: its record (schedule, lambdas, procedures with the held-out verdict at
    each), its tokens per prompt at each setting against full Best-of-N's on the same candidates, and per setting
    the paired difference pruned - full, each at its own lambda of that setting (star: each decoder's own lambda*)."""
    mine = scores[scores["method"] == PRUNED]
    if "tokens" not in mine.columns or not np.isfinite(mine["tokens"].to_numpy(dtype=float)).all():
        raise DataError(f"--scores ({PRUNED}): no token counts (column tokens); decode it with lara select-bon-prune")
    full = {k: v.set_index("prompt_id") for k, v in scores[scores["method"] == "bon"].groupby("setting")}
    settings = []
    for named, g in mine.groupby("setting", sort=False):
        tokens, tokens_full = float(g["tokens"].mean()), float(g["tokens_full"].mean())
        row = {"setting": named, "lambda": float(g["lambda"].iloc[0]), "tokens": tokens, "tokens_full": tokens_full,
               "token_ratio": tokens_full / tokens if tokens > 0 else None, "paired_vs_full": []}
        if named in full:
            row["paired_vs_full"] = [{"metric": metric, "comparison": f"{PRUNED} {named} - bon {named}", **diff}
                                     for metric, diff in paired_metrics(g.set_index("prompt_id"), full[named],
                                                                        n_boot, seed)]
        settings.append(row)
    return {"lambda_json": record.path, "decoder": record.decoder, "lambda_hat": record.lambda_hat,
            "lambda_star": record.lambda_star, "status": record.status,
            "procedures": procedure_audit(record, decoders, PRUNED), "settings": settings}


def paired_metrics(a: pd.DataFrame, b: pd.DataFrame, n_boot: int, seed: int):
    """(metric, the bootstrap of the per-prompt differences a - b) for each of PAIRED_METRICS that ``a`` has
    (some finite), on the prompts (the index) both have."""
    left, right = a.align(b, join="inner", axis=0)
    for metric in PAIRED_METRICS:
        if metric in left.columns and np.isfinite(left[metric].to_numpy(dtype=float)).any():
            yield metric, paired_difference(left[metric], right[metric], n_boot, seed)


def paired_audit(scores: pd.DataFrame, n_boot: int, seed: int) -> list[dict]:
    """Per decoder, lambda* minus each other setting on the same test prompts (a bootstrap of the
    per-prompt differences), for every metric both outputs have."""
    rows = []
    for method, g in scores.groupby("method", sort=False):
        by_setting = {k: v.set_index("prompt_id") for k, v in g.groupby("setting")}
        for a, b in PAIRS:
            if a not in by_setting or b not in by_setting:
                continue
            rows += [{"method": method, "comparison": f"{a} - {b}", "metric": metric, **diff}
                     for metric, diff in paired_metrics(by_setting[a], by_setting[b], n_boot, seed)]
    return rows


def sweep_audit(sweep: pd.DataFrame, n: int) -> dict:
    """The sweep's per-lambda verdicts: the decoder's N, and every N."""
    cols = ["lambda", "label", "mean_cost", "mean_cost_lo", "mean_cost_hi", "mean_cost_lower", "mean_cost_upper",
            "verdict", "mean_reward"]

    if "tau" in sweep.columns:  # each row's own budget (another listed tau's rows: tau=T)
        cols.append("tau")

    def rows(g):
        g = g.sort_values(["lambda", "label"])
        return [{**r, "ci95": [r.pop("mean_cost_lo"), r.pop("mean_cost_hi")],
                 "one_sided95": [r.pop("mean_cost_lower"), r.pop("mean_cost_upper")]}
                for r in g[cols].to_dict("records")]

    main = rows(sweep[sweep["n"] == n])
    soft = [{"beta": float(r["label"].split("=", 1)[1]), **r} for r in main if r["label"].startswith("soft_beta=")]
    return {"by_lambda": main, "by_n": {str(k): rows(g) for k, g in sweep.groupby("n")},
            "soft_mode": sorted(soft, key=lambda r: r["beta"])}


OUTPUTS = ("out", "audit")  # the files this step writes (checked before it computes: lara.cli.check_outputs)


def add_arguments(parser) -> None:
    parser.add_argument("--scores", nargs="+", required=True, help="evaluate outputs (parquet)")
    parser.add_argument("--judge", nargs="*", default=[], help="judge outputs (parquet), if any")
    parser.add_argument("--bon-star", default=None, help="evaluated Best-of-N at lambda* (for the audit)")
    parser.add_argument("--lambda-json", default=None)
    parser.add_argument("--sweep", default=None, help="the Best-of-N sweep.csv: the audit at every lambda")
    parser.add_argument("--prune-lambda-json", default=None,
                        help="pruned Best-of-N's own record (lambda_bon_prune.json): its outputs' lambdas are checked "
                        "against it and the audit's `pruned` section compares it with full Best-of-N")
    parser.add_argument("--tau-lambda-json", nargs="*", default=[],
                        help="the lambda.json of each other listed calibration.tau (audited at its star_tau_<tau> "
                        "setting; the audit's `taus`)")
    add_settings_arguments(parser, AuditSettings)
    parser.add_argument("--out", required=True, help="summary.csv")
    parser.add_argument("--audit", required=True, help="constraint_audit.json")


def read_scores(args) -> tuple[pd.DataFrame, dict]:
    """Every evaluated output, checked: each file once, each prompt once per (method, setting), every output
    on the same test prompts; the prompt set they share."""
    metrics = ("helpfulness", "harmfulness")
    identity.distinct_files(args.scores, "--scores")
    identity.distinct_files(args.judge, "--judge")
    tables = []
    for p in args.scores:
        art = identity.table(p, "--scores", required=("prompt_id", "method", "setting", *metrics), finite=metrics)
        identity.expect_role(p, "--scores", "test", "decoded on the calibration prompts, its audit is in-sample and "
                             "says nothing about held-out prompts: evaluate outputs decoded on the test prompts",
                             art.identity)
        tables.append(art.df.assign(_file=str(p)))
    scores = pd.concat(tables, ignore_index=True)
    sets = {}
    for (method, named), g in scores.groupby(["method", "setting"], sort=False):
        files = " and ".join(pd.unique(g["_file"]))
        sets[f"--scores {files} ({method} at {named})"] = identity.prompt_set(g, f"--scores {files} ({method} at "
                                                                                 f"{named})", per_prompt=1)
    identity.same_prompts(sets)
    return scores.drop(columns="_file"), next(iter(sets.values()))


def check_settings_lambdas(scores: pd.DataFrame, main: LambdaRecord | None, others: list[LambdaRecord],
                           prune: LambdaRecord | None = None) -> None:
    """Each output decoded at a setting that reads a lambda record (star, hat, crc, ltt, star_tau_<tau>) was decoded
    at that record's lambda (pruned Best-of-N: its own record, --prune-lambda-json): a file labelled star but decoded
    at another lambda is refused, and so is a pruned decoder's output without its record."""
    by_tau = {tau_name(r.tau): r for r in others}
    for (method, named), g in scores.groupby(["method", "setting"], sort=False):
        own = setting_tau(named)
        record = by_tau.get(tau_name(own)) if own is not None else main
        if method == PRUNED:
            record = prune
            if record is None and named in ("hat", "star", *CERTIFIED):
                raise DataError(f"--scores ({method} at {named}): the pruned decoder's lambda is its own; pass its "
                                "record (--prune-lambda-json lambda_bon_prune.json)")
        want = identity.record_value(record, named) if record is not None else None
        if want is None:
            continue
        if "lambda" not in g.columns or g["lambda"].isna().any():
            raise DataError(f"--scores ({method} at {named}): no lambda column (or an empty one): an output of a "
                            f"calibrated setting states the lambda it was decoded at; evaluate the decoder's output")
        lam = pd.unique(g["lambda"])
        if len(lam) != 1 or not np.isclose(float(lam[0]), want[0], rtol=1e-9, atol=1e-12):
            shown = ", ".join(f"{x:.6g}" for x in lam)
            raise DataError(f"--scores ({method} at {named}): decoded at lambda = {shown}, expected {want[1]}")


def check_schedules(paths, prune: LambdaRecord | None) -> None:
    """Pruned Best-of-N's outputs are one decoder's: the schedule each states (lara select-bon-prune's identity) is the
    one the others state and --prune-lambda-json's decoder's (a setting decoded with another schedule is another
    decoder, never one row of the summary beside it)."""
    want = (prune.decoder or {}).get("schedule") if prune is not None else None
    first = (want, f"--prune-lambda-json {prune.path}") if want else None

    def shown(schedule: dict) -> str:
        return ", ".join(f"{k} {v}" for k, v in sorted(schedule.items()) if k != "n")

    for p in paths:
        found = identity.read_identity(p)
        if found.get("method") != PRUNED or found.get("schedule") is None:
            continue
        if first is not None and found["schedule"] != first[0]:
            raise DataError(f"--scores {p} ({PRUNED} at {found.get('setting')}): decoded with schedule "
                            f"{shown(found['schedule'])} (N = {found['schedule'].get('n')}), but {first[1]} with "
                            f"{shown(first[0])} (N = {first[0].get('n')}): one pruned decoder's outputs are compared; "
                            "decode every setting with the record's schedule (decode.bon_prune)")
        first = first or (found["schedule"], f"--scores {p}")


def audit_star(args, s: AuditSettings, test_prompts) -> tuple[dict, LambdaRecord]:
    """The held-out audit of Best-of-N at lambda*, after checking --bon-star is that output (method, setting,
    lambda, record, tau, N) on prompts the calibration did not see."""
    star = identity.table(args.bon_star, "--bon-star", required=("prompt_id", "decoder_cost"), finite=("decoder_cost",))
    lam = read_lambda(args.lambda_json)
    check_budget(lam, s.tau)
    identity.expect_decoded_with(star, lam, "star", method="bon")
    prompts = star.prompts(per_prompt=1)
    identity.same_prompts({"--scores (the test prompts)": test_prompts, star.where: prompts})
    seen = identity.disjoint(identity.read_identity(lam.path).get("prompts"), prompts, star.where)
    if seen:
        raise DataError(f"{star.where}: {seen} of its {prompts.n} prompts are calibration prompts of {lam.path}; an "
                        "in-sample audit says nothing about held-out prompts: audit on prompts the calibration did "
                        "not see")
    audit = constraint_audit(star.df, lam, s.bootstrap, s.seed, s.overpenalised_lambda)
    log.info("constraint audit: Best-of-N at lambda*=%.4g: mean cost %.4f, 95%% CI [%.4f, %.4f], tau %.4g: %s",
             audit["lambda_star"], audit["mean_cost"], *audit["ci95"], lam.tau, audit["verdict"])
    if audit.get("note"):
        log.warning("%s", audit["note"])
    if args.sweep:
        sweep = read_sweep(args.sweep, lam, prompts)
        audit |= sweep_audit(sweep, lam.decoder_n or int(sweep["n"].max()))  # the record's N, else the largest
    return audit, lam


def read_sweep(path: str, lam: LambdaRecord, prompts) -> pd.DataFrame:
    """The sweep, its numbers finite numbers, checked against the record the audit is for (identity.check_sweep)."""
    from lara.read.files import read_table, require_finite

    numbers = ("n", "lambda", "mean_cost", "mean_cost_lo", "mean_cost_hi", "mean_cost_lower", "mean_cost_upper",
               "mean_reward")
    sweep = read_table(path, required=(*numbers, "label", "verdict"))
    require_finite(sweep, [c for c in (*numbers, "tau", "n_prompts") if c in sweep.columns], f"--sweep {path}")
    identity.check_sweep(sweep, lam, f"--sweep {path}", prompts)
    check_sweep_rows(sweep, lam.tau, f"--sweep {path}")
    return sweep


def check_sweep_rows(sweep: pd.DataFrame, tau: float, where: str) -> None:
    """Each row's verdict is the one its own one-sided bounds give against its tau (the sweep is a CSV, unsealed: an
    edited mean or verdict is found by its own numbers), and its mean lies within those bounds."""
    from lara.stats import verdict

    taus = sweep["tau"] if "tau" in sweep.columns else pd.Series(tau, index=sweep.index)
    counts = sweep["n_prompts"] if "n_prompts" in sweep.columns else pd.Series(None, index=sweep.index)
    for i, r in enumerate(sweep.itertuples(index=False)):
        lo, up, mean, t = float(r.mean_cost_lower), float(r.mean_cost_upper), float(r.mean_cost), float(taus.iloc[i])
        n = None if pd.isna(counts.iloc[i]) else int(counts.iloc[i])
        want = verdict(lo, up, t, n)
        if r.verdict != want or not lo - 1e-9 * max(1.0, abs(lo)) <= mean <= up + 1e-9 * max(1.0, abs(up)):
            raise DataError(f"{where}: row {i} (N = {r.n}, lambda {float(sweep['lambda'].iloc[i]):g}, {r.label}): mean "
                            f"cost {mean:g}, verdict {r.verdict!r}, but its own bounds [{lo:g}, {up:g}] against tau "
                            f"{t:g} give {want!r}: edited after lara bon-sweep wrote it; rerun the sweep")


def audit_taus(args, s: AuditSettings, audit: dict) -> None:
    others = [read_lambda(p) for p in args.tau_lambda_json]
    if not others:
        return
    if not args.lambda_json:
        raise DataError("--tau-lambda-json: the other taus are audited beside the main one; pass --lambda-json")
    main = read_lambda(args.lambda_json)
    check_budget(main, s.tau)
    for path, r in zip(args.tau_lambda_json, others, strict=True):
        if (r.decoder.get("kind"), r.decoder_n) != (main.decoder.get("kind"), main.decoder_n):
            raise DataError(f"--tau-lambda-json {path}: calibrated for {r.decoder.get('kind')} with N = {r.decoder_n}, "
                            f"but the audit's decoder is {main.decoder.get('kind')} with N = {main.decoder_n} "
                            f"({args.lambda_json}): each tau's lambda* is for the audited decoder")
    taus = [main.tau] + [r.tau for r in others]
    if len(set(taus)) != len(taus):
        raise DataError(f"--tau-lambda-json: two records were calibrated for the same tau ({taus})")
    audit["taus"] = tau_audit(main, others, audit["decoders"])


def log_audit(audit: dict, summary: pd.DataFrame) -> None:
    """The audit and the summary as they are made, in short (``lara summary`` prints them in
    full; it reads this module's files, so this module does not import it)."""
    for r in audit.get("procedures") or []:
        h = r["held_out"]
        log.info("%-9s lambda %.4g%s: %s%s", r["procedure"], r["lambda"], " (deployed)" if r["deployed"] else "",
                 r["statement"], "" if h is None else f"; held out: cost {h['mean_cost']:.4f}, {h['verdict']}")
    for r in audit["decoders"]:
        log.info("%-10s %-7s lambda %s: decoder cost %.4f [%.4f, %.4f] against tau %.4g: %s", r["method"],
                 r["setting"], "-" if r["lambda"] is None else f"{r['lambda']:.4g}", r["mean_cost"], *r["ci95"],
                 r["tau"], r["verdict"])
    for r in audit.get("taus") or []:
        log.info("tau %.4g: lambda* %.4g (%s)%s", r["tau"], r["lambda_star"], r["status"],
                 "".join(f"; {m} at lambda*: cost {d['mean_cost']:.4f}, {d['verdict']}"
                         for m, d in r["decoders"].items()))
    for r in (audit.get("pruned") or {}).get("settings") or []:
        log.info("pruned Best-of-N at %s (lambda %.4g): %.1f tokens per prompt, full Best-of-N %.1f (ratio %s)",
                 r["setting"], r["lambda"], r["tokens"], r["tokens_full"],
                 "-" if r["token_ratio"] is None else f"{r['token_ratio']:.2f}")
    for r in audit["paired"]:
        log.info("%-10s %-12s %-15s %+.4f [%+.4f, %+.4f]", r["method"], r["comparison"], r["metric"], r["mean"],
                 *r["ci95"])
    for r in summary.itertuples(index=False):
        log.info("%-10s %-7s helpfulness %.3f harmfulness %.3f safe %.3f", r.method, r.setting, r.helpfulness,
                 r.harmfulness, r.safe_rate)


def check_judged_responses(judged: list, evaluated: list) -> None:
    """A judge file rated the very responses its evaluation scored: the responses file each names (its digest)
    is the one the evaluation of the same method and setting names (ratings of another run's responses, relabelled
    as this run's, are refused)."""
    from lara.read.files import read_table

    def key(path):
        df = read_table(path)
        return tuple(str(df[c].iloc[0]) if c in df.columns and len(df) else None for c in ("method", "setting"))

    made = {key(p): (identity.read_identity(p).get("made_from") or {}).get("--responses") for p in evaluated}
    for path in judged:
        rated = (identity.read_identity(path).get("made_from") or {}).get("--responses")
        want = made.get(key(path))
        if rated is not None and want is not None and rated != want:
            method, setting = key(path)
            raise DataError(f"--judge {path}: rated other responses ({rated}) than the evaluation of {method} at "
                            f"{setting} scored ({want}): ratings of another run's responses")


def check_judged(judge: pd.DataFrame, scores: pd.DataFrame, paths) -> None:
    """Every judged response is one of the evaluated outputs, once: (prompt_id, method, setting) unique across the
    judge files and present in the scores (ratings of another run's or another prompt's responses are refused)."""
    key = ["prompt_id", "method", "setting"]
    missing = [c for c in key if c not in judge.columns]
    if missing:
        raise DataError(f"--judge {' '.join(map(str, paths))}: missing column(s) {', '.join(missing)}")
    from lara.read.expect import check_nullable_numbers

    check_nullable_numbers(judge, [c for c in judge.columns if c.startswith("judge_")],
                           f"--judge {' '.join(map(str, paths))}",
                           "a rating is a finite number (empty: the judge failed)")
    keys = judge[key].astype(str)
    twice = keys.duplicated(keep=False)
    if twice.any():
        row = keys[twice.to_numpy()].iloc[0]
        raise DataError(f"--judge: the response of prompt {row['prompt_id']!r} ({row['method']} at {row['setting']}) "
                        f"is rated {int(twice.sum())} times across {len(paths)} file(s); each response once")
    known = set(map(tuple, scores[key].astype(str).to_numpy()))
    extra = [k for k in map(tuple, keys.to_numpy()) if k not in known]
    if extra:
        raise DataError(f"--judge: {len(extra)} rated response(s) are not among --scores, e.g. prompt {extra[0][0]!r} "
                        f"({extra[0][1]} at {extra[0][2]}): ratings of another run or of other prompts")


def run(args) -> None:
    from lara.io import write_json
    from lara.read.files import read_table, write_table

    s = read_settings(args, AuditSettings)
    check_replicates(s.bootstrap)
    scores, test_prompts = read_scores(args)
    judge = pd.concat([read_table(p) for p in args.judge], ignore_index=True) if args.judge else None
    if judge is not None:
        check_judged(judge, scores, args.judge)
        check_judged_responses(args.judge, args.scores)
    main = read_lambda(args.lambda_json) if args.lambda_json else None
    prune = read_lambda(args.prune_lambda_json) if args.prune_lambda_json else None
    if prune is not None:
        check_budget(prune, s.tau, key="calibration.tau (the pruned decoder's record)")
    check_settings_lambdas(scores, main, [read_lambda(p) for p in args.tau_lambda_json], prune)
    check_schedules(args.scores, prune)
    summary = summarise(scores, judge, s.bootstrap, s.seed)
    audit = {"question": "no Best-of-N at lambda* in this experiment"}
    if args.bon_star:
        audit, lam = audit_star(args, s, test_prompts)
    audit["decoders"] = decoder_audit(scores, s.tau, s.bootstrap, s.seed)
    audit["paired"] = paired_audit(scores, s.bootstrap, s.seed)
    if args.bon_star:
        audit["procedures"] = procedure_audit(lam, audit["decoders"])
    audit_taus(args, s, audit)
    if prune is not None and (scores["method"] == PRUNED).any():
        audit["pruned"] = pruned_audit(scores, prune, audit["decoders"], s.bootstrap, s.seed)
    log_audit(audit, summary)
    write_table(summary, args.out)
    audit[identity.KEY] = identity.stamp(
        "audit", args.audit, tau=s.tau, lambda_record=identity.file_digest(args.lambda_json) if main else None,
        test_prompts=test_prompts.record(), summary=identity.file_digest(args.out),
        made_from={"--lambda-json": args.lambda_json, "--sweep": args.sweep, "--bon-star": args.bon_star,
                   "--prune-lambda-json": args.prune_lambda_json})
    write_json(args.audit, audit)
