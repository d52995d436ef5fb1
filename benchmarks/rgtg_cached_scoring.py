"""Benchmark: tokens/s of token-level decoding with cached candidate scoring against the naive
reference (k full re-forwards per token), in one process, with identical tokens checked.

    python benchmarks/rgtg_cached_scoring.py --models results/tiny/models   # after `make run`
    python benchmarks/rgtg_cached_scoring.py --smollm2 DIR                  # a SmolLM2-135M-sized policy/scorer

k = 50 candidates, 128 new tokens by default (the paper's k; goal: cached >= 10x naive).
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from lara.decode.rgtg import RGTGSettings, decode

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="results/tiny/models", help="a toy run's models directory")
    p.add_argument("--smollm2", default=None, help="use this causal LM as policy and as scorer backbone instead")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--new-tokens", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    if args.smollm2:
        tok = AutoTokenizer.from_pretrained(args.smollm2)
        policy = AutoModelForCausalLM.from_pretrained(args.smollm2).eval()
        reward = AutoModelForSequenceClassification.from_pretrained(args.smollm2, num_labels=1).eval()
        cost = AutoModelForSequenceClassification.from_pretrained(args.smollm2, num_labels=1).eval()
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        prompts = ["How do I bake bread?", "Give me a tip for sleeping better.", "How can I save money?",
                   "What should I pack for a hike?"] * (args.prompts // 4 + 1)
    else:
        tok = AutoTokenizer.from_pretrained(f"{args.models}/sft")
        policy = AutoModelForCausalLM.from_pretrained(f"{args.models}/sft").eval()
        reward = AutoModelForSequenceClassification.from_pretrained(f"{args.models}/reward").eval()
        cost = AutoModelForSequenceClassification.from_pretrained(f"{args.models}/cost").eval()
        prompts = pd.read_parquet(f"{args.models}/../data/prompts_test.parquet")["prompt"].tolist()
    prompts = prompts[:args.prompts]
    # decode to the full length (EOS does not stop a row), so every row takes the same steps
    s = RGTGSettings(top_k=args.top_k, weight=2.0, temperature=0.0, max_new_tokens=args.new_tokens,
                     batch_size=len(prompts), stop_at_eos=False)
    results = {}
    for name, cached in (("cached", True), ("naive", False)):
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = decode(policy, reward, cost, tok, prompts, 0.5, s, seed=0, cached=cached)
        elapsed = time.perf_counter() - t0
        n = sum(len(t) for t in out)
        results[name] = (out, n / elapsed, elapsed, n)
        print(f"{name:6s}: {n} tokens in {elapsed:7.2f} s = {n / elapsed:8.1f} tokens/s")
    print(f"identical tokens: {results['cached'][0] == results['naive'][0]}")
    print(f"speed-up (tokens/s cached / naive) at k={args.top_k}: {results['cached'][1] / results['naive'][1]:.1f}x "
          f"(goal >= 10x)")


if __name__ == "__main__":
    main()
