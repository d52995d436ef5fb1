"""Pruned Best-of-N (``decode.bon_prune``): N candidates drawn as one batch, all but the best few stopped at stated
checkpoints by the partial reward and cost models (``r_p - lambda c_p``), the final choice by ``r - lambda c`` among
the survivors (:mod:`lara.calibrate.pruned` has the decoder's definition and its calibration).

Two ways in, one decoder:

* ``lara select-bon-prune`` runs it on the N candidates already drawn for a test prompt (the ``bon`` pool, its
  prefixes scored by ``lara score-prefixes``): the decoder's choice on those draws, and the tokens and scorer
  calls it would have spent (a stopped candidate cost min(its length, the checkpoint) tokens). This is how the
  workflow audits it, on the same draws as full Best-of-N.
* :func:`generate_pruned` generates with the stopping actually done (the survivors continue from their KV cache,
  stopped candidates leave the batch): what a deployment runs, and what ``benchmarks/bon_prune.py`` times.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from lara.settings import (
    Settings,
    add_settings_arguments,
    cross_key,
    ordered_bounds,
    read_settings,
    seed_setting,
    setting,
)

log = logging.getLogger(__name__)


class Scheduled:
    """What every settings class holding the schedule's keys (checkpoints, keep, n, max_new_tokens) derives from
    them: whether there is a pruned decoder, and its :class:`~lara.calibrate.pruned.Schedule`."""

    @property
    def enabled(self) -> bool:
        return bool(self.checkpoints)

    def schedule(self):
        from lara.calibrate.pruned import make_schedule

        return make_schedule(self.n, self.checkpoints, self.keep, self.max_new_tokens)


@dataclass(frozen=True)
class PruneSettings(Scheduled, Settings):
    """decode.bon_prune: the pruned Best-of-N decoder and its own calibration (an empty schedule: no such
    decoder)."""

    SECTION: ClassVar[str] = "decode.bon_prune"

    n: int = setting(help="Best-of-N candidates.", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response in tokens (fractions of it are checkpoints).", minimum=1,
                                  key="generation.max_new_tokens")
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
    checkpoints: list[float] = setting(
        [], "Where candidates are stopped, in generated tokens (an integer) or as a fraction of "
            "generation.max_new_tokens (a number in (0, 1), rounded up); increasing. Empty: no pruned decoder.",
        exclusive_minimum=0)
    keep: list[float] = setting(
        [], "How many candidates survive each checkpoint: a count (an integer) or a fraction of N (a number in "
            "(0, 1), rounded up); each below the number alive before it.", exclusive_minimum=0)
    grid_points: int = setting(501, "Lambdas of the calibration grid on [0, calibration.lambda_search_max] (the "
                                    "pruned decoder's cost need not be monotone in lambda: it is searched on this "
                                    "grid and every deployed lambda is a grid point).", minimum=2)
    max_subsets: int = setting(500, "The decoder's expected cost over N of a prompt's K samples is exact over all "
                                    "C(K, N) subsets when there are at most this many (K = N: one), else over this "
                                    "many drawn uniformly (its standard error recorded).", minimum=1)
    seed: int = seed_setting()

    @cross_key("calibration.cost_bounds", witness={"calibration": {"cost_bounds": [1.0, -1.0]}})
    def bounds_ordered(self):
        return ordered_bounds(self.cost_bounds, "calibration.cost_bounds")

    @cross_key("decode.bon_prune.checkpoints", "decode.bon_prune.keep", "decode.bon_n",
               "generation.max_new_tokens", witness={"decode": {"bon_prune": {"checkpoints": [4, 2], "keep": [4, 2]}}})
    def schedule_valid(self):
        if not self.checkpoints and not self.keep:
            return None
        try:
            schedule = self.schedule()
        except ValueError as exc:
            return (f"decode.bon_prune.checkpoints: {exc} (checkpoints {self.checkpoints}, keep {self.keep}, N = "
                    f"{self.n})")
        if schedule.checkpoints[-1] >= self.max_new_tokens:
            return (f"decode.bon_prune.checkpoints: the last checkpoint, {schedule.checkpoints[-1]} tokens, is not "
                    f"below generation.max_new_tokens = {self.max_new_tokens}: every candidate would be finished "
                    "there, and stopping it saves nothing")
        return None


@dataclass(frozen=True)
class PruneScheduleSettings(Scheduled, Settings):
    """The pruned decoder's schedule alone: what scoring the prefixes (lara score-prefixes) and running the decoder on
    drawn candidates (lara select-bon-prune) read. Its lambda comes from its record, so a new tau or bootstrap reruns
    neither the prefix scores nor its zero and max settings."""

    n: int = setting(help="Best-of-N candidates.", minimum=2, key="decode.bon_n")
    max_new_tokens: int = setting(help="Longest response in tokens (fractions of it are checkpoints).", minimum=1,
                                  key="generation.max_new_tokens")
    checkpoints: list[float] = setting(help="The schedule's checkpoints.", exclusive_minimum=0,
                                       key="decode.bon_prune.checkpoints")
    keep: list[float] = setting(help="The schedule's survivors.", exclusive_minimum=0, key="decode.bon_prune.keep")


def prefix_columns(checkpoints) -> list[tuple[int, str, str]]:
    """(checkpoint, reward column, cost column) of a prefix-scores table, one per checkpoint."""
    return [(int(t), f"prefix_reward_{int(t)}", f"prefix_cost_{int(t)}") for t in checkpoints]


# ---------------------------------------------------------------------------------------------
# The table of candidates with their prefix scores


def check_lengths(df, max_new_tokens: int, where: str) -> None:
    """Generated lengths a response can have: whole numbers in [1, max_new_tokens] (the checkpoints count them)."""
    from lara.read.files import DataError

    n_tok = df["n_tokens"].to_numpy(float)
    bad = ~np.isfinite(n_tok) | (n_tok < 1) | (n_tok != np.round(n_tok)) | (n_tok > max_new_tokens)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DataError(f"{where}: column 'n_tokens' holds {str(df['n_tokens'].iloc[i])} (row {i}, prompt "
                        f"{str(df['prompt_id'].iloc[i])!r}), not a whole number in [1, generation.max_new_tokens = "
                        f"{max_new_tokens}]")


def check_scores(df, columns, where: str) -> None:
    """Score columns of real numbers (not booleans, not text), every one finite and within range."""
    from lara.read.files import DataError, require_finite, require_in_range

    for col in columns:
        dtype = df[col].dtype
        if pd.api.types.is_bool_dtype(dtype) or not pd.api.types.is_numeric_dtype(dtype):
            raise DataError(f"{where}: column {col!r} holds {dtype} values, not scores (real numbers)")
    require_finite(df, columns, where)
    require_in_range(df, columns, where)


def read_prefix_scores(path, schedule, where: str, max_new_tokens: int | None = None):
    """(ids, PrefixScores, row index (P, K), the table) of a ``lara score-prefixes`` table for ``schedule``: its
    checkpoints must be the schedule's (named in the table's identity and columns), every score a finite real number,
    every length a whole number in [1, max_new_tokens]."""
    from lara.calibrate.pruned import PrefixScores
    from lara.decode.bon import score_matrix
    from lara.read.files import DataError, read_table

    cols = prefix_columns(schedule.checkpoints)
    needed = ("prompt_id", "sample_id", "reward", "cost", "n_tokens", *[c for _, r, k in cols for c in (r, k)])
    df = read_table(path, required=needed)
    have = sorted(int(c.rsplit("_", 1)[1]) for c in df.columns if c.startswith("prefix_reward_"))
    if have != [t for t, _, _ in cols]:
        raise DataError(f"{where} {path}: prefix scores at {have} tokens, but decode.bon_prune.checkpoints are "
                        f"{[t for t, _, _ in cols]} tokens: rescore the prefixes (lara score-prefixes)")
    check_scores(df, [c for c in needed[2:] if c != "n_tokens"], f"{where} {path}")
    check_lengths(df, max_new_tokens or int(np.nanmax(df["n_tokens"].to_numpy(float)) or 1), f"{where} {path}")
    try:
        ids, reward, cost, index = score_matrix(df)
    except ValueError as exc:
        raise DataError(f"{where} {path}: {exc}") from None
    flat = index.ravel()
    length = df.loc[flat, "n_tokens"].to_numpy(np.int64).reshape(index.shape)
    pr = np.stack([df.loc[flat, r].to_numpy(float).reshape(index.shape) for _, r, _ in cols], axis=-1)
    pc = np.stack([df.loc[flat, c].to_numpy(float).reshape(index.shape) for _, _, c in cols], axis=-1)
    return ids, PrefixScores(reward, cost, length, pr, pc), index, df


# ---------------------------------------------------------------------------------------------
# lara select-bon-prune

HELP = "select the pruned Best-of-N candidate (decode.bon_prune) at a named lambda setting, with its token count"


def add_arguments(parser) -> None:
    from lara.calibrate.record import add_lambda_arguments

    parser.add_argument("--candidates", required=True,
                        help="the N candidates per test prompt with their prefix scores (lara score-prefixes)")
    add_lambda_arguments(parser)
    add_settings_arguments(parser, PruneScheduleSettings)
    parser.add_argument("--out", required=True, help="output parquet: one response per prompt")


def check_record(lambda_json, schedule, setting_name: str, tau: float | None = None) -> None:
    """A lambda read from a record must have been calibrated for this very pruned decoder (its N, schedule and tau),
    and the record must be what lara calibrate-prune wrote (:func:`check_record_values`): full Best-of-N's record,
    one for another schedule or tau, or one edited by hand is refused."""
    if setting_name in ("zero", "max") or not lambda_json:
        return
    from lara.calibrate.record import check_budget, parse_setting, read_lambda
    from lara.read.files import DataError

    if parse_setting(setting_name) is not None:
        return
    rec = read_lambda(lambda_json)
    decoder = rec.decoder
    if decoder.get("kind") != "pruned_best_of_n":
        raise DataError(f"--lambda-json {lambda_json}: calibrated for {decoder.get('kind')!r}, not for the pruned "
                        "Best-of-N decoder: its lambda is calibrated for itself (lara calibrate-prune), never "
                        "borrowed from full Best-of-N")
    if decoder.get("schedule") != schedule.as_dict():
        raise DataError(f"--lambda-json {lambda_json}: calibrated for {decoder.get('schedule')}, but the decoder's "
                        f"schedule is {schedule.as_dict()} (decode.bon_prune, decode.bon_n): recalibrate")
    if tau is not None:
        check_budget(rec, tau)
    check_record_values(rec)


def check_record_values(rec) -> None:
    """What calibrate-prune guarantees of its record and a hand edit breaks: its tau and schedule are its settings',
    and every procedure's lambda is a point of its grid whose recorded calibration mean cost and tokens are the
    curve's there."""
    from lara.calibrate.pruned import make_schedule
    from lara.read.files import DataError

    where = f"{rec.path}: a pruned Best-of-N record"
    st, curves = rec.get("settings") or {}, rec.get("curves") or {}
    try:
        own = make_schedule(st["n"], st["checkpoints"], st["keep"], st["max_new_tokens"]).as_dict()
        grid = np.asarray(curves["lambda"], dtype=float)
        cost = np.asarray(curves["mean_cost"], dtype=float)
        tokens = np.asarray(curves["mean_tokens"], dtype=float)
    except (KeyError, TypeError, ValueError):
        raise DataError(f"{where} without its settings or curves (written by lara calibrate-prune)") from None
    if own != rec.decoder.get("schedule") or st.get("tau") != rec.tau:
        raise DataError(f"{where} whose decoder ({rec.decoder.get('schedule')}, tau {rec.tau:g}) is not its own "
                        f"settings' ({own}, tau {st.get('tau')}): edited after lara calibrate-prune wrote it; "
                        "recalibrate")
    if not (len(grid) == len(cost) == len(tokens) >= 2):
        raise DataError(f"{where} whose curves are not one grid (written by lara calibrate-prune)")
    for name, p in (rec.get("procedures") or {}).items():
        at = np.flatnonzero(np.isclose(grid, p.get("lambda", np.nan), rtol=0, atol=1e-12))
        if len(at) != 1 or not np.isclose(cost[at[0]], p.get("mean_cost", np.nan), rtol=1e-9, atol=1e-12) or \
                not np.isclose(tokens[at[0]], p.get("mean_tokens", np.nan), rtol=1e-9, atol=1e-12):
            raise DataError(f"{where}: procedures.{name}.lambda = {p.get('lambda')!r} is not the grid point whose "
                            "calibration mean cost and tokens it records: edited after lara calibrate-prune wrote it; "
                            "recalibrate")


def run(args) -> None:
    from lara import identity
    from lara.calibrate.pruned import run as run_pruned
    from lara.calibrate.record import resolve_lambda
    from lara.read.files import write_table

    s = read_settings(args, PruneScheduleSettings)
    if not s.enabled:
        from lara.settings import ConfigError

        raise ConfigError("decode.bon_prune.checkpoints is empty: there is no pruned decoder to run")
    schedule = s.schedule()
    ids, ps, index, df = read_prefix_scores(args.candidates, schedule, "--candidates", s.max_new_tokens)
    if ps.shape[1] != schedule.n:
        from lara.read.files import DataError

        raise DataError(f"--candidates {args.candidates}: {ps.shape[1]} candidates per prompt, but the decoder draws "
                        f"N = {schedule.n} (decode.bon_n)")
    lam = resolve_lambda(args.setting, args.overpenalised_lambda, args.lambda_json)
    check_record(args.lambda_json, schedule, args.setting)
    prompts = identity.prompt_set(df, f"--candidates {args.candidates}")
    o = run_pruned(ps.reward, ps.cost, ps.length, ps.prefix_reward, ps.prefix_cost, lam, schedule)
    rows = np.arange(len(ids))
    chosen = df.loc[index[rows, o.pick]].copy()
    chosen["method"], chosen["setting"], chosen["lambda"] = "bon_prune", args.setting, lam
    chosen["tokens"] = o.tokens
    chosen["tokens_full"] = ps.length.sum(axis=1)  # what full Best-of-N generated on the same draws
    chosen["prefix_scored"], chosen["full_scored"] = o.prefix_scored, o.full_scored
    drop = [c for c in chosen.columns if c.startswith("prefix_reward_") or c.startswith("prefix_cost_")]
    chosen = chosen.drop(columns=drop)
    log.info("%s at lambda=%s (%.6g): mean reward %.4f, mean cost %.4f; %.1f tokens per prompt (full Best-of-%d: "
             "%.1f, ratio %.2f)", schedule.describe(), args.setting, lam, chosen["reward"].mean(),
             chosen["cost"].mean(), chosen["tokens"].mean(), schedule.n, chosen["tokens_full"].mean(),
             chosen["tokens_full"].sum() / max(1, chosen["tokens"].sum()))
    made = identity.decoded_identity("responses", args.out, "bon_prune", args.setting, lam, args.lambda_json,
                                     n=schedule.n, role=identity.role_of(args.candidates),
                                     prompts=prompts.record(), made_from={"--candidates": args.candidates})
    write_table(chosen.reset_index(drop=True), args.out, {"setting": args.setting, "lambda": lam,
                                                          "schedule": schedule.as_dict(),
                                                          "candidates": args.candidates, identity.KEY: made})


# ---------------------------------------------------------------------------------------------
# Generating with the stopping done (benchmarks/bon_prune.py; a deployment)


@dataclass
class Generated:
    """One prompt's pruned (or full) Best-of-N generation: the chosen response, its full scores, and what it
    spent."""

    response: str
    reward: float
    cost: float
    tokens: int  # tokens generated over all candidates
    policy_steps: int  # batched forward passes of the policy
    scorer_calls: int  # sequences scored (prefix and full, each by two models)
    seconds: float
    extra: dict = field(default_factory=dict)


def generate_pruned(policy, tokenizer, prompt: str, n: int, schedule, lam: float, scorers: dict, *,
                    temperature: float, top_k: int, max_new_tokens: int, generator=None) -> Generated:
    """Generate ``n`` candidates for ``prompt`` as one batch, stopping all but the best ``keep[j]`` at checkpoint j by
    the partial scorers (``scorers['prefix_reward']``, ``['prefix_cost']``: objects with ``score(prompts,
    responses)``), and choose among the survivors by the full ones (``['reward']``, ``['cost']``), ties as Best-of-N's.
    ``schedule`` None: full Best-of-n (``extra`` then holds every candidate's full reward and cost). Tokens are drawn
    at ``temperature`` from the top ``top_k`` (the pool sampler's rule); a stopped candidate leaves the batch and its
    rows of the KV cache are dropped."""
    import torch
    from transformers import DynamicCache

    from lara.calibrate.bestofn import order, select
    from lara.decode.rgtg import _cache_keyword
    from lara.scoring import encode

    t0 = time.perf_counter()
    if schedule is not None and schedule.n != n:
        raise ValueError(f"the schedule is for N = {schedule.n}, asked for {n} candidates")
    device = next(policy.parameters()).device
    head = encode(tokenizer, prompt, "", False)
    inp = torch.tensor([head] * n, device=device)
    eos = tokenizer.eos_token_id
    checkpoints = dict(zip(schedule.checkpoints, schedule.keep, strict=True)) if schedule is not None else {}
    alive = list(range(n))  # the candidate of each batch row
    tokens: list[list[int]] = [[] for _ in range(n)]
    done = [False] * n
    cache, kw = DynamicCache(), _cache_keyword(policy)
    steps, scored = 0, 0
    with torch.inference_mode():
        for t in range(1, max_new_tokens + 1):
            logits = policy(input_ids=inp, use_cache=True, **{kw: cache}).logits[:, -1].float()
            steps += 1
            top = torch.topk(logits / max(temperature, 1e-6), min(top_k, logits.shape[-1]))
            draw = torch.multinomial(torch.softmax(top.values, dim=-1).cpu(), 1, generator=generator).to(device)
            pick = top.indices.gather(1, draw)
            for row, cand in enumerate(alive):
                if not done[cand]:
                    tokens[cand].append(int(pick[row, 0]))
                    done[cand] = tokens[cand][-1] == eos
            if all(done[c] for c in alive):
                break
            if t in checkpoints and len(alive) > checkpoints[t]:
                texts = [tokenizer.decode(tokens[c], skip_special_tokens=True).strip() for c in alive]
                pr = np.asarray(scorers["prefix_reward"].score([prompt] * len(alive), texts), dtype=float)
                pc = np.asarray(scorers["prefix_cost"].score([prompt] * len(alive), texts), dtype=float)
                scored += 2 * len(alive)
                keep_rows = sorted(order(pr[None], pc[None], lam)[0][:checkpoints[t]].tolist())
                alive = [alive[r] for r in keep_rows]
                cache.batch_select_indices(torch.tensor(keep_rows, device=device))
                pick = pick[keep_rows]
            inp = pick
    texts = [tokenizer.decode([x for x in tokens[c] if x != eos], skip_special_tokens=True).strip() for c in alive]
    r = np.asarray(scorers["reward"].score([prompt] * len(alive), texts), dtype=float)
    c = np.asarray(scorers["cost"].score([prompt] * len(alive), texts), dtype=float)
    scored += 2 * len(alive)
    best = int(select(r[None], c[None], lam)[0])
    extra = {"reward": r.tolist(), "cost": c.tolist()} if schedule is None else {}
    return Generated(texts[best], float(r[best]), float(c[best]), sum(len(x) for x in tokens), steps, scored,
                     time.perf_counter() - t0, extra)
