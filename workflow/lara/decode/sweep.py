"""``lara bon-sweep``: the Best-of-N lambda sweep on the test prompts (the data of the paper's Fig. 1)
with the held-out constraint audit at every lambda.

For each N in ``--n`` (each at most the M candidates stored per test prompt) and each lambda, the
expected reward, cost and safe fraction of Best-of-N over a random N-subset of a prompt's M
candidates (exact: the rank average of :mod:`lara.calibrate.bestofn`; N = M is the argmax that
``lara select-bon`` picks), averaged over test prompts, with a percentile bootstrap 95 % interval
over prompts. The verdict compares the cost with tau through its one-sided 95 % bounds
(``mean_cost_lower``, ``mean_cost_upper``): met, violated or inconclusive
(:mod:`lara.stats`). Rows labelled
``lambda_hat``/``lambda_star`` are each N's calibrated values (from the lambda.json calibrated for
that N); rows labelled ``soft_beta=B`` apply the lambda* of a soft-mode calibration (the paper's
Algorithm 1 at beta = B, ``--soft-lambda-json``) to Best-of-N at the largest N, so the audit holds the
paper's estimator to tau beside bon mode; rows labelled ``tau=T`` apply the lambda* calibrated for another
listed tau T (``--tau-lambda-json``) at its N, with the verdict against T (their ``tau`` column); rows
labelled ``crc``/``ltt`` are each N's certified lambdas (recorded when calibration.cost_bounds is set); rows labelled
``core:P`` are procedure P's lambda of Best-of-k calibrated through the calibration core on its grid
(``--k-lambda-json``: ``lara calibrate-best-of-k``) at N = k, audited like the others.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lara.calibrate.certify import CERTIFIED
from lara.settings import Settings, add_settings_arguments, read_settings, seed_setting, setting
from lara.stats import interval, verdict

log = logging.getLogger(__name__)

HELP = "Best-of-N lambda sweep with the held-out constraint audit at every lambda, for one or more N"



@dataclass(frozen=True)
class SweepSettings(Settings):
    """What the Best-of-N sweep reads from the config."""

    lambda_grid: list[float] = setting(help="Lambda values of the sweep (each lambda.json adds its lambda-hat and "
                                            "lambda*).", minimum=0, key="decode.lambda_grid")
    tau: float | None = setting(None, "The cost budget of the audit verdicts (null: no verdicts); each lambda.json "
                                      "given must have been calibrated for it.", key="calibration.tau")
    bootstrap: int = setting(2000, "Bootstrap replicates over test prompts.", minimum=1, key="evaluation.bootstrap")
    seed: int = seed_setting()


def sweep_table(reward: np.ndarray, cost: np.ndarray, lams, labels, n: int, tau: float | None,
                n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """One row per lambda: Best-of-n expected reward, cost and safe fraction on the test prompts,
    each with a bootstrap 95 % interval over prompts, the cost's one-sided 95 % bounds and the verdict
    against tau."""
    from lara.calibrate.bestofn import expected

    mask = np.ones_like(reward, dtype=bool)
    lams = np.asarray(lams, dtype=np.float64)
    cols = {"mean_reward": reward, "mean_cost": cost, "safe_fraction": (cost <= 0).astype(float)}
    per_prompt = dict(zip(cols, expected(reward, cost, mask, lams, n, *cols.values()), strict=True))
    return held_out_table(pd.DataFrame({"n": n, "lambda": lams, "label": labels}), per_prompt, tau, n_boot, seed)


def held_out_table(table: pd.DataFrame, per_prompt: dict, tau: float | None, n_boot: int, seed: int) -> pd.DataFrame:
    """``table`` (one row per lambda) with each column of ``per_prompt`` ((P, L) per-prompt values) as a mean over the
    test prompts with its bootstrap 95 % interval, the cost's one-sided 95 % bounds and the verdict against tau: the
    held-out audit of every decoder's sweep (Best-of-N's, pruned Best-of-N's)."""
    for name, values in per_prompt.items():
        mean, lo, hi, lower, upper = interval(values, n_boot, seed)
        table[name], table[f"{name}_lo"], table[f"{name}_hi"] = mean, lo, hi
        if name == "mean_cost":
            table["mean_cost_lower"], table["mean_cost_upper"] = lower, upper
    if tau is not None:
        n = next(iter(per_prompt.values())).shape[0]
        table["tau"] = tau
        table["verdict"] = [verdict(lo, up, tau, n)
                            for lo, up in zip(table["mean_cost_lower"], table["mean_cost_upper"], strict=True)]
    return table


def read_records(args, tau: float | None, sizes: list[int], m: int) -> tuple[dict, list, list]:
    """The lambda records of the sweep, each checked: bon-mode records one per swept N (--lambda-json), soft-mode
    records (--soft-lambda-json), and the other taus' records at a swept N (--tau-lambda-json)."""
    from lara.calibrate.record import check_budget, read_lambda
    from lara.read.files import DataError

    calibrated = {}
    for path in args.lambda_json:
        rec = read_lambda(path)
        check_budget(rec, tau)
        if rec.decoder.get("kind") != "best_of_n":
            raise DataError(f"--lambda-json {path}: decoder {rec.decoder.get('kind')} ({rec.mode} mode), expected "
                            "best_of_n (a bon-mode record); soft-mode records go to --soft-lambda-json")
        n = rec.decoder_n or m
        if n in calibrated:
            raise DataError(f"--lambda-json {path}: a second record for Best-of-{n} (the first: "
                            f"{calibrated[n].path}); one record per N")
        if n not in sizes:
            raise DataError(f"{path}: calibrated for Best-of-N with N = {n}, which is not a swept size {sizes} "
                            "(decode.bon_n, decode.sweep_n)")
        calibrated[n] = rec
    soft = []
    for path in args.soft_lambda_json:
        rec = read_lambda(path)
        check_budget(rec, tau)
        if rec.mode != "soft":
            raise DataError(f"{path}: calibrated in {rec.mode} mode; --soft-lambda-json takes soft-mode records")
        soft.append(rec)
    other_taus = []
    for path in args.tau_lambda_json:
        rec = read_lambda(path)
        if rec.decoder.get("kind") != "best_of_n":
            raise DataError(f"--tau-lambda-json {path}: decoder {rec.decoder.get('kind')} ({rec.mode} mode), expected "
                            "best_of_n (a bon-mode record): its lambda* is swept as Best-of-N's at its tau")
        n = rec.decoder_n or m
        if n not in sizes:
            raise DataError(f"{path}: calibrated for Best-of-N with N = {n}, which is not a swept size {sizes}")
        if tau is not None and rec.tau == tau:
            raise DataError(f"{path}: calibrated for the main tau = {rec.tau:g}; --tau-lambda-json takes the others")
        other_taus.append((n, rec))
    return calibrated, soft, other_taus


def core_records(paths, tau: float | None, sizes: list[int]) -> dict:
    """Best-of-k's records from the calibration core (--k-lambda-json), each checked as its decoder's (the core's
    record check) and for a swept N = k: {k: record}."""
    from lara.calibrate.best_of_k import BestOfK
    from lara.calibrate.procedures import check_record
    from lara.calibrate.record import read_lambda
    from lara.read.files import DataError

    out = {}
    for path in paths:
        rec = read_lambda(path)
        decoder = BestOfK.from_settings(rec.get("settings") or {"k": rec.decoder_n, "n": 0})
        check_record(rec, decoder, tau, f"--k-lambda-json {path}")
        if decoder.k not in sizes or decoder.k in out:
            why = f"is not a swept size {sizes} (decode.sweep_n)" if decoder.k not in sizes else "has a second record"
            raise DataError(f"--k-lambda-json {path}: Best-of-{decoder.k} {why}; one record per swept k")
        out[decoder.k] = rec
    return out


def record_column(labels: pd.Series, calibrated, soft: list) -> list[str]:
    """Each row's lambda record (the digest of the lambda.json its lambda came from; empty for the grid): the
    sweep carries which calibration each labelled row is, so its consumers can check it is theirs."""
    from lara.identity import file_digest

    own = file_digest(calibrated.path) if calibrated is not None else ""
    by_label = {f"soft_beta={rec.get('beta'):g}": file_digest(rec.path) for rec in soft}
    return [by_label.get(label, "" if label == "grid" else own) for label in labels]


def sweep_lambdas(grid, rec=None, feasible_only: bool = False) -> tuple[list[float], list[str]]:
    """The lambdas of a sweep with their labels: the grid, then a record's own (lambda-hat, lambda* and each certified
    procedure's, calibration.cost_bounds); a procedure that certified none is skipped where ``feasible_only``, else
    refused."""
    lams, labels = list(grid), ["grid"] * len(grid)
    if rec is not None:
        lams, labels = [*lams, rec.lambda_hat, rec.lambda_star], [*labels, "lambda_hat", "lambda_star"]
        procedures = rec.get("procedures") or {}
        for name in CERTIFIED:
            entry = procedures.get(name)
            if (entry and entry.get("feasible", True)) if feasible_only else name in procedures:
                lams.append(rec.procedure_lambda(name))
                labels.append(name)
    return lams, labels


def finite_grid(values) -> list[float]:
    """decode.lambda_grid as floats: at least one, every one finite (refused otherwise), each once (a value listed
    twice is swept once: a sweep names each row once)."""
    grid = list(dict.fromkeys(float(x) for x in values))
    if not grid or any(not np.isfinite(x) for x in grid):
        from lara.config import ConfigError

        raise ConfigError(f"decode.lambda_grid {values!r}: lambda values must be finite, at least one")
    return grid


def check_held_out(records, prompts, candidates) -> None:
    """The swept test prompts are none of the records' calibration prompts (a sweep on them is in-sample)."""
    from lara import identity
    from lara.read.files import DataError

    for rec in records:
        seen = identity.disjoint(identity.read_identity(rec.path).get("prompts"), prompts, "--candidates")
        if seen:
            raise DataError(f"--candidates {candidates}: {seen} of its {prompts.n} prompts are calibration "
                            f"prompts of {rec.path}; a sweep on them is in-sample: its verdicts say nothing held out")


def add_arguments(parser) -> None:
    parser.add_argument("--candidates", required=True, help="scored candidates (prompt_id, sample_id, reward, cost)")
    for flag, text in (
            ("--lambda-json", "lambda.json files, each calibrated for one Best-of-N size (their decoder.n): add that "
                              "N's lambda-hat and lambda* rows"),
            ("--soft-lambda-json", "soft-mode lambda.json files (any beta): their lambda* applied to Best-of-N at the "
                                   "largest N, rows labelled soft_beta=B"),
            ("--tau-lambda-json", "lambda.json files of other listed taus (calibration.tau): their lambda* at their N, "
                                  "rows labelled tau=T with the verdict against T"),
            ("--k-lambda-json", "Best-of-k records of the calibration core (lara calibrate-best-of-k), each at a swept "
                                "N = k: every procedure's lambda, rows labelled core:PROCEDURE")):
        parser.add_argument(flag, nargs="*", default=[], help=text)
    parser.add_argument("--n", type=int, nargs="*", default=None,
                        help="Best-of-N sizes to sweep (default: the candidates per prompt)")
    add_settings_arguments(parser, SweepSettings)
    parser.add_argument("--out", required=True, help="output CSV")


def run(args) -> None:
    from lara import identity
    from lara.decode.bon import read_scored
    from lara.read.files import DataError, write_table
    from lara.stats import check_replicates

    s = read_settings(args, SweepSettings)
    check_replicates(s.bootstrap)
    df, _, reward, cost, _ = read_scored(args.candidates)
    prompts = identity.prompt_set(df, f"--candidates {args.candidates}")
    m = reward.shape[1]
    sizes = args.n or [m]
    if len(set(sizes)) != len(sizes):
        raise DataError(f"--n {' '.join(map(str, sizes))}: a size given twice would sweep it twice; each N once")
    too_big = [n for n in sizes if not 1 <= n <= m]
    if too_big:
        raise DataError(f"{args.candidates}: Best-of-N sizes {too_big} need 1 <= N <= {m}, the candidates per prompt")
    calibrated, soft, other_taus = read_records(args, s.tau, sizes, m)
    core = core_records(args.k_lambda_json, s.tau, sizes)
    check_held_out([*calibrated.values(), *soft, *(r for _, r in other_taus), *core.values()], prompts,
                   args.candidates)
    grid = finite_grid(s.lambda_grid)
    t0 = time.perf_counter()
    tables = []
    for n in sizes:
        lams, labels = sweep_lambdas(grid, calibrated.get(n))
        if n == max(sizes):
            lams += [rec.lambda_star for rec in soft]
            labels += [f"soft_beta={rec.get('beta'):g}" for rec in soft]
        tables.append(sweep_table(reward, cost, lams, labels, n, s.tau, s.bootstrap, s.seed))
        tables[-1]["record"] = record_column(tables[-1]["label"], calibrated.get(n), soft)
        if n in core:
            at = {"hat": core[n].lambda_hat} | {name: p["lambda"] for name, p in core[n].get("procedures").items()
                                                if p["feasible"]}
            tables.append(sweep_table(reward, cost, list(at.values()), [f"core:{name}" for name in at], n, s.tau,
                                      s.bootstrap, s.seed)
                          .assign(record=identity.file_digest(core[n].path)))
    for n, rec in other_taus:
        tables.append(sweep_table(reward, cost, [rec.lambda_star], [f"tau={rec.tau:g}"], n, rec.tau, s.bootstrap,
                                  s.seed).assign(record=identity.file_digest(rec.path)))
    table = pd.concat(tables, ignore_index=True).assign(n_prompts=prompts.n, prompt_set=prompts.digest)
    log.info("sweep of %d rows (N in %s) x %d prompts x %d candidates in %.3f s", len(table), sizes, reward.shape[0],
             m, time.perf_counter() - t0)
    for r in table.to_dict("records"):
        log.info("N=%d lambda=%.4f (%s): mean reward %.4f, mean cost %.4f [%.4f, %.4f], safe %.3f%s", r["n"],
                 r["lambda"], r["label"], r["mean_reward"], r["mean_cost"], r["mean_cost_lo"], r["mean_cost_hi"],
                 r["safe_fraction"], f": {r['verdict']}" if s.tau is not None else "")
    write_table(table, args.out)
