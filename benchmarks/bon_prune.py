"""Pruned Best-of-N against full Best-of-N and one sample, generated for real on the same prompts (issue 47).

    python benchmarks/bon_prune.py toy --run results/tiny [--prompts 256] [--device cuda]
    python benchmarks/bon_prune.py realtext --model results/real-text/import/smollm2-135m-instruct \\
        --prompts-file results/real-text/data/rtp_prompts.jsonl [--n-cal 40 --n-test 40]

Each decoder generates on every test prompt (a seeded generator per prompt and decoder): full Best-of-N (N candidates
to the end, the choice by r - lambda c), pruned Best-of-N (:func:`lara.decode.prune.generate_pruned`: the stopping
actually done, stopped candidates leave the batch), and the floor (one sample). Each decoder runs at its own
lambda*: ``toy`` reads the finished toy run's records (calibration/lambda.json for Best-of-N, lambda_bon_prune.json
for the pruned decoder, both also at their LTT lambda); ``realtext`` calibrates both on its own calibration prompts
(K = N samples of SmolLM2-135M-Instruct, reward fluency, cost hatesonar's P(offensive), prefixes scored by the same
scorers) before the test prompts.

Printed, measured in this run: generated tokens, batched policy forward passes, sequences scored, wall time, mean
reward and cost with bootstrap 95 % intervals and the verdict against tau; the ratios full / pruned at lambda*; the
share of full Best-of-N's reward gain over one sample that the pruned decoder keeps; and the ratio at matched reward
(the smallest full Best-of-N' whose held-out reward, exact over N'-subsets of the full run's candidates, reaches the
pruned decoder's, against the pruned decoder's tokens). The floor the hardware allows is the one-sample row: one
candidate's tokens. Writes a JSON with every number (--out).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def load_policy(path: str, device: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
    return model, tok


def decode_all(policy, tok, prompts, n, schedule, lams: dict, scorers, gen: dict, seed: int) -> dict:
    """Every decoder on every prompt: {name: [Generated]}. ``lams``: decoder name -> (lambda, schedule or None, n)."""
    import torch

    from lara.decode.prune import generate_pruned

    out = {name: [] for name in lams}
    t0 = time.perf_counter()
    for i, prompt in enumerate(prompts):
        for j, (name, (lam, sched, k)) in enumerate(lams.items()):
            g = torch.Generator().manual_seed(seed * 1_000_003 + i * 101 + j)
            out[name].append(generate_pruned(policy, tok, prompt, k, sched, lam, scorers, generator=g, **gen))
        if (i + 1) % 10 == 0 or i + 1 == len(prompts):
            print(f"  {i + 1}/{len(prompts)} prompts, {time.perf_counter() - t0:.0f} s", flush=True)
    return out


def summarise(runs: dict, tau: float, n_boot: int = 2000) -> dict:
    from lara.stats import interval, verdict

    rows = {}
    for name, gens in runs.items():
        r = np.array([g.reward for g in gens])[:, None]
        c = np.array([g.cost for g in gens])[:, None]
        rm, rlo, rhi, _, _ = (float(x[0]) for x in interval(r, n_boot, 0))
        cm, clo, chi, clow, cup = (float(x[0]) for x in interval(c, n_boot, 0))
        rows[name] = {"prompts": len(gens), "tokens": float(np.mean([g.tokens for g in gens])),
                      "policy_steps": float(np.mean([g.policy_steps for g in gens])),
                      "scored": float(np.mean([g.scorer_calls for g in gens])),
                      "seconds": float(np.sum([g.seconds for g in gens])),
                      "reward": [rm, rlo, rhi], "cost": [cm, clo, chi],
                      "verdict": verdict(clow, cup, tau, len(gens))}
    return rows


def matched(full_runs: list, lam: float, target_reward: float, tokens_pruned: float) -> dict:
    """The smallest N' whose Best-of-N' held-out reward (exact over N'-subsets of each prompt's N full candidates,
    at lambda) reaches ``target_reward``, its expected tokens (N'/N of the full run's) and the ratio to the pruned
    decoder's tokens."""
    from lara.calibrate.bestofn import expected

    r = np.array([g.extra["reward"] for g in full_runs])
    c = np.array([g.extra["cost"] for g in full_runs])
    n = r.shape[1]
    tokens_full = float(np.mean([g.tokens for g in full_runs]))
    curve = []
    for k in range(1, n + 1):
        rew = float(expected(r, c, np.ones_like(r, dtype=bool), [lam], k, r)[0, :, 0].mean())
        curve.append({"n": k, "reward": rew, "tokens": tokens_full * k / n})
    hit = next((p for p in curve if p["reward"] >= target_reward), None)
    return {"curve": curve, "matched_n": hit and hit["n"], "matched_tokens": hit and hit["tokens"],
            "ratio_at_matched_reward": hit and hit["tokens"] / tokens_pruned}


def report(rows: dict, full: str, pruned: str, single: str) -> dict:
    f, p, s = rows[full], rows[pruned], rows[single]
    gain_full = f["reward"][0] - s["reward"][0]
    return {"token_ratio": f["tokens"] / p["tokens"], "wall_ratio": f["seconds"] / p["seconds"],
            "scored_ratio": f["scored"] / p["scored"], "steps_ratio": f["policy_steps"] / p["policy_steps"],
            "reward_gain_kept": (p["reward"][0] - s["reward"][0]) / gain_full if gain_full > 0 else None}


def print_table(rows: dict, tau: float) -> None:
    print(f"\n{'decoder':26} {'tokens':>8} {'steps':>6} {'scored':>7} {'wall s':>8}  {'reward [95% CI]':>24}  "
          f"{'cost [95% CI]':>24}  verdict (tau {tau:g})")
    for name, r in rows.items():
        print(f"{name:26} {r['tokens']:8.1f} {r['policy_steps']:6.1f} {r['scored']:7.1f} {r['seconds']:8.2f}  "
              f"{r['reward'][0]:8.3f} [{r['reward'][1]:6.3f}, {r['reward'][2]:6.3f}]  "
              f"{r['cost'][0]:8.3f} [{r['cost'][1]:6.3f}, {r['cost'][2]:6.3f}]  {r['verdict'].split(' (')[0]}")


# ---------------------------------------------------------------------------------------------


def toy(args) -> dict:
    import pandas as pd

    from lara.calibrate.pruned import Schedule
    from lara.calibrate.record import read_lambda
    from lara.scoring import load_scorer

    run = Path(args.run)
    full_rec = read_lambda(run / "calibration/lambda.json")
    prune_rec = read_lambda(run / "calibration/lambda_bon_prune.json")
    sched_d = prune_rec.decoder["schedule"]
    schedule = Schedule(sched_d["n"], tuple(sched_d["checkpoints"]), tuple(sched_d["keep"]))
    n = schedule.n
    policy, tok = load_policy(str(run / "models/sft"), args.device)
    scorers = {"reward": load_scorer(str(run / "models/reward"), role="reward", device=args.device),
               "cost": load_scorer(str(run / "models/cost"), role="cost", device=args.device),
               "prefix_reward": load_scorer(str(run / "models/partial_reward"), role="reward", device=args.device),
               "prefix_cost": load_scorer(str(run / "models/partial_cost"), role="cost", device=args.device)}
    prompts = pd.read_parquet(run / "data/prompts_test.parquet")["prompt"].tolist()[:args.prompts]
    lams = {f"full Best-of-{n} at its lambda*": (full_rec.lambda_star, None, n),
            f"pruned Best-of-{n} at its lambda*": (prune_rec.lambda_star, schedule, n),
            "one sample": (0.0, None, 1)}
    if "ltt" in (prune_rec.get("procedures") or {}) and "ltt" in (full_rec.get("procedures") or {}):
        lams[f"full Best-of-{n} at its LTT"] = (full_rec.procedure_lambda("ltt"), None, n)
        lams[f"pruned Best-of-{n} at its LTT"] = (prune_rec.procedure_lambda("ltt"), schedule, n)
    gen = {"temperature": args.temperature, "top_k": args.top_k, "max_new_tokens": args.max_new_tokens}
    print(f"toy run {run}: {len(prompts)} test prompts; {schedule.describe()}; device {args.device}")
    runs = decode_all(policy, tok, prompts, n, schedule, lams, scorers, gen, args.seed)
    return finish(runs, lams, full_rec.tau, n, schedule, {"run": str(run), "device": args.device})


def finish(runs, lams, tau, n, schedule, meta) -> dict:
    rows = summarise(runs, tau)
    print_table(rows, tau)
    out = {"meta": meta | {"schedule": schedule.as_dict(), "tau": tau,
                           "lambdas": {k: v[0] for k, v in lams.items()}}, "rows": rows, "comparisons": {}}
    single = "one sample"
    for tag in ("lambda*", "LTT"):
        full, pruned = f"full Best-of-{n} at its {tag}", f"pruned Best-of-{n} at its {tag}"
        if full in rows and pruned in rows:
            cmp = report(rows, full, pruned, single)
            cmp |= {k: v for k, v in matched(runs[full], lams[full][0], rows[pruned]["reward"][0],
                                             rows[pruned]["tokens"]).items() if k != "curve"}
            out["comparisons"][tag] = cmp
            kept = "-" if cmp["reward_gain_kept"] is None else f"{cmp['reward_gain_kept']:.1%}"
            at = ("no smaller N reaches it" if cmp["matched_n"] is None else
                  f"Best-of-{cmp['matched_n']} ({cmp['matched_tokens']:.1f} tokens): "
                  f"{cmp['ratio_at_matched_reward']:.2f}x")
            print(f"\nat each decoder's {tag}: {cmp['token_ratio']:.2f}x fewer tokens, {cmp['wall_ratio']:.2f}x less "
                  f"wall time, {cmp['scored_ratio']:.2f}x fewer sequences scored, {cmp['steps_ratio']:.2f}x fewer "
                  f"policy steps; reward gain over one sample kept: {kept}; at matched held-out reward: {at}")
    return out


def realtext(args) -> dict:
    from lara.calibrate import bestofn
    from lara.calibrate.procedures import calibrate as calibrate_decoder
    from lara.calibrate.pruned import PrefixScores, PrunedBestOfN, PruneSettings, make_schedule
    from lara.decode.prefixes import prefixes
    from lara.read.files import read_table
    from lara.sample import GenerationSettings, HFGenerator
    from lara.scoring import load_scorer

    n = args.n
    schedule = make_schedule(n, args.checkpoints, args.keep, args.max_new_tokens)
    prompts = read_table(args.prompts_file, required=("prompt",))["prompt"].drop_duplicates().tolist()
    rng = np.random.default_rng(args.seed)
    pick = rng.permutation(len(prompts))[:args.n_cal + args.n_test]
    cal, test = [prompts[i] for i in pick[:args.n_cal]], [prompts[i] for i in pick[args.n_cal:]]
    scorers = {"reward": load_scorer(f"fluency:{args.model}", role="reward", device=args.device),
               "cost": load_scorer(f"hatesonar:{args.constraint}", role="cost")}
    scorers["prefix_reward"], scorers["prefix_cost"] = scorers["reward"], scorers["cost"]
    print(f"real text: SmolLM2 {args.model}; {len(cal)} calibration and {len(test)} test prompts "
          f"(RealToxicityPrompts); reward fluency, cost P({args.constraint}); {schedule.describe()}; tau {args.tau}")
    t0 = time.perf_counter()
    gen = HFGenerator(args.model)
    s = GenerationSettings(temperature=args.temperature, top_k=args.top_k, max_new_tokens=args.max_new_tokens,
                           batch_size=max(n, 20))
    df = gen.generate([f"c{i}" for i in range(len(cal))], cal, n, s, args.seed)
    print(f"  calibration samples: {len(df)} in {time.perf_counter() - t0:.0f} s", flush=True)
    df["reward"] = scorers["reward"].score(df["prompt"].tolist(), df["response"].tolist())
    df["cost"] = scorers["cost"].score(df["prompt"].tolist(), df["response"].tolist())
    pr, pc = [], []
    for t in schedule.checkpoints:
        texts = prefixes(gen.tokenizer, df["prompt"].tolist(), df["response"].tolist(), t)
        pr.append(np.asarray(scorers["reward"].score(df["prompt"].tolist(), texts)))
        pc.append(np.asarray(scorers["cost"].score(df["prompt"].tolist(), texts)))
    shape = (len(cal), n)
    ps = PrefixScores(df["reward"].to_numpy(float).reshape(shape), df["cost"].to_numpy(float).reshape(shape),
                      df["n_tokens"].to_numpy(np.int64).reshape(shape),
                      np.stack([x.reshape(shape) for x in pr], -1), np.stack([x.reshape(shape) for x in pc], -1))
    print(f"  calibration scored in {time.perf_counter() - t0:.0f} s", flush=True)
    settings = PruneSettings(n=n, max_new_tokens=args.max_new_tokens, tau=args.tau, lambda_search_max=args.lambda_max,
                             bootstrap=2000, quantile=0.975, guarantee="bootstrap", delta=0.1, cost_bounds=[0.0, 1.0],
                             checkpoints=list(schedule.checkpoints), keep=list(schedule.keep), seed=args.seed)
    rec = calibrate_decoder(PrunedBestOfN(ps, schedule, settings.max_subsets, settings.seed), settings, ps.cost,
                            "the benchmark's calibration samples")
    mask = np.ones(shape, dtype=bool)
    st = bestofn.steps(ps.reward, ps.cost, mask, n, args.lambda_max)
    boot = np.random.default_rng(args.seed).multinomial(len(cal), np.full(len(cal), 1 / len(cal)), size=2000)
    full_roots, _ = bestofn.roots(st, boot / len(cal), args.tau, args.lambda_max)
    full_star = float(np.quantile(full_roots, 0.975))
    full_hat = float(bestofn.roots(st, np.full((1, len(cal)), 1 / len(cal)), args.tau, args.lambda_max)[0][0])
    print(f"  full Best-of-{n}: lambda-hat {full_hat:.4g}, lambda* {full_star:.4g}; pruned: lambda-hat "
          f"{rec['lambda_hat']:.4g}, lambda* {rec['lambda_star']:.4g} (calibration tokens ratio "
          f"{rec['tokens']['ratio_at_lambda_star']:.2f})", flush=True)
    del gen
    policy, tok = load_policy(args.model, args.device)
    lams = {f"full Best-of-{n} at its lambda*": (full_star, None, n),
            f"pruned Best-of-{n} at its lambda*": (rec["lambda_star"], schedule, n),
            "one sample": (0.0, None, 1)}
    gen_kw = {"temperature": args.temperature, "top_k": args.top_k, "max_new_tokens": args.max_new_tokens}
    runs = decode_all(policy, tok, test, n, schedule, lams, scorers, gen_kw, args.seed + 1)
    return finish(runs, lams, args.tau, n, schedule,
                  {"model": args.model, "device": args.device, "n_cal": len(cal), "n_test": len(test),
                   "calibration": {"full": {"lambda_hat": full_hat, "lambda_star": full_star},
                                   "pruned": {k: rec[k] for k in ("lambda_hat", "lambda_star", "tokens",
                                                                   "monotone")}}})


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="world", required=True)
    t = sub.add_parser("toy")
    t.add_argument("--run", default="results/tiny")
    t.add_argument("--prompts", type=int, default=256)
    r = sub.add_parser("realtext")
    r.add_argument("--model", default="results/real-text/import/smollm2-135m-instruct")
    r.add_argument("--prompts-file", default="results/real-text/data/rtp_prompts.jsonl")
    r.add_argument("--n-cal", type=int, default=40)
    r.add_argument("--n-test", type=int, default=40)
    r.add_argument("--n", type=int, default=20)
    r.add_argument("--checkpoints", type=float, nargs="+", default=[4, 8])
    r.add_argument("--keep", type=float, nargs="+", default=[6, 3])
    r.add_argument("--constraint", default="offensive")
    r.add_argument("--tau", type=float, default=0.27)
    r.add_argument("--lambda-max", type=float, default=100.0)
    for q in (t, r):
        q.add_argument("--device", default="cpu")
        q.add_argument("--temperature", type=float, default=1.2)
        q.add_argument("--top-k", type=int, default=50)
        q.add_argument("--max-new-tokens", type=int, default=None)
        q.add_argument("--seed", type=int, default=0)
        q.add_argument("--out", default=None, help="write every number as JSON here")
    args = p.parse_args(argv)
    if args.max_new_tokens is None:
        args.max_new_tokens = 48 if args.world == "toy" else 32
    import torch

    torch.set_num_threads(max(1, torch.get_num_threads()))
    t0 = time.perf_counter()
    out = toy(args) if args.world == "toy" else realtext(args)
    out["meta"]["seconds"] = time.perf_counter() - t0
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1, default=lambda o: None if o is None else str(o)))
    print(f"\ndone in {out['meta']['seconds']:.0f} s" + (f"; {args.out}" if args.out else ""))


if __name__ == "__main__":
    main()
