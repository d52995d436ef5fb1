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

import numpy as np

from lara.calibrate.pruned import PruneScheduleSettings
from lara.settings import add_settings_arguments, read_settings

log = logging.getLogger(__name__)


HELP = "select the pruned Best-of-N candidate (decode.bon_prune) at a named lambda setting, with its token count"


def add_arguments(parser) -> None:
    from lara.calibrate.record import add_lambda_arguments

    parser.add_argument("--candidates", required=True,
                        help="the N candidates per test prompt with their prefix scores (lara score-prefixes)")
    add_lambda_arguments(parser)
    add_settings_arguments(parser, PruneScheduleSettings)
    parser.add_argument("--out", required=True, help="output parquet: one response per prompt")


def check_record(lambda_json, decoder, setting_name: str, tau: float | None = None) -> None:
    """A lambda read from a record (hat, star, the certified ones) must have been calibrated for this very decoder:
    the calibration core's comparison (:func:`lara.calibrate.procedures.check_record`)."""
    from lara.calibrate.procedures import check_record as core_check
    from lara.calibrate.record import parse_setting, read_lambda

    if setting_name in ("zero", "max") or not lambda_json or parse_setting(setting_name) is not None:
        return
    core_check(read_lambda(lambda_json), decoder, tau, f"--lambda-json {lambda_json}")


def read_candidates(path, schedule, max_new_tokens: int):
    """(ids, prefix scores, row index (P, N), table) of the test prompts' candidates (``--candidates``), N of them per
    prompt: the decoder's N."""
    from lara.calibrate.pruned import PrefixScores
    from lara.read.candidates import read_prefix_scores

    ids, arrays, index, df = read_prefix_scores(path, schedule.checkpoints, "--candidates", max_new_tokens)
    ps = PrefixScores(*arrays)
    if ps.shape[1] != schedule.n:
        from lara.read.files import DataError

        raise DataError(f"--candidates {path}: {ps.shape[1]} candidates per prompt, but the decoder draws "
                        f"N = {schedule.n} (decode.bon_n)")
    return ids, ps, index, df


def run(args) -> None:
    from lara import identity
    from lara.calibrate.grid import require_enabled
    from lara.calibrate.pruned import PrunedBestOfN
    from lara.calibrate.pruned import run as run_pruned
    from lara.calibrate.record import resolve_lambda
    from lara.decode.bon import write_choice

    s = read_settings(args, PruneScheduleSettings)
    require_enabled(s, "run")
    schedule = s.schedule()
    ids, ps, index, df = read_candidates(args.candidates, schedule, s.max_new_tokens)
    lam = resolve_lambda(args.setting, args.overpenalised_lambda, args.lambda_json)
    check_record(args.lambda_json, PrunedBestOfN(None, schedule), args.setting)
    prompts = identity.prompt_set(df, f"--candidates {args.candidates}")
    o = run_pruned(ps.reward, ps.cost, ps.length, ps.prefix_reward, ps.prefix_cost, lam, schedule)
    chosen = df.loc[index[np.arange(len(ids)), o.pick]]
    chosen = chosen.drop(columns=[c for c in chosen.columns if c.startswith(("prefix_reward_", "prefix_cost_"))])
    full = ps.length.sum(axis=1)  # what full Best-of-N generated on the same draws
    log.info("%s at lambda=%s (%.6g): mean reward %.4f, mean cost %.4f; %.1f tokens per prompt (full Best-of-%d: "
             "%.1f, ratio %.2f)", schedule.describe(), args.setting, lam, chosen["reward"].mean(),
             chosen["cost"].mean(), o.tokens.mean(), schedule.n, full.mean(), full.sum() / max(1, o.tokens.sum()))
    write_choice(chosen, args, "bon_prune", lam, schedule.n, prompts, {"schedule": schedule.as_dict()},
                 {"tokens": o.tokens, "tokens_full": full, "prefix_scored": o.prefix_scored,
                  "full_scored": o.full_scored}, schedule=schedule.as_dict())  # its identity: one decoder per schedule


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
