"""Token-level decoding against the reference ARGS loop, with the floor the forwards allow.

    python benchmarks/rgtg_reference.py --models results/tiny/models        # after `make run`
    python benchmarks/rgtg_reference.py --smollm2 ~/.cache/lara-tests/smollm2-135m-instruct

The reference is the ARGS search loop as its authors run it (deeplearning-wisc/args, argsearch.py),
re-written here: one prompt at a time; the policy steps with its KV cache; every step the top-k
tokens go to the reward model as k one-token rows against its cached prefix (the cache expanded to
k rows), and after the choice the scorer's cache is cut back to the chosen row; a second scorer does
the same for the cost, and the token score is log pi_ref + w (r - lambda c), greedy. lara's cached
decoder (`lara.decode.rgtg.decode`) runs the same models on the same prompts; the tokens must be
identical. Rows of the table, in tokens/s (every row decodes the full --new-tokens; every case runs
once per round, --repeats rounds, and its best time counts):

* reference: the loop above (batch 1 by construction; at batch 8 it decodes the 8 prompts in turn);
* cached: lara's decoder at batch 1 and at batch 8;
* floor: only the forwards a step cannot avoid (one cached policy step, one pass of the k candidates
  through each scorer against its cache, as lara makes them), timed alone in the same run at the
  same lengths: what a step would cost with no top-k, host copies or cache bookkeeping;
* generate: the policy alone with `model.generate` (greedy), the speed of plain sampling.
"""

from __future__ import annotations

import argparse
import time


def _expand(cache, k: int):
    """A DynamicCache with every batch row's keys/values repeated k times (row-major: b*k rows)."""
    from transformers import DynamicCache

    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.repeat_interleave(k, 0), layer.values.repeat_interleave(k, 0), i)
    return out


def _select(cache, row: int):
    """Keep one batch row of a DynamicCache (the chosen candidate's)."""
    from transformers import DynamicCache

    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys[row:row + 1].clone(), layer.values[row:row + 1].clone(), i)
    return out


def reference_decode(policy, reward, cost, tok, prompt: str, lam: float, k: int, w: float, new_tokens: int):
    """The ARGS search loop for one prompt (greedy), with a reward and a cost scorer."""
    import torch

    from lara.scoring import encode

    ids = torch.tensor([encode(tok, prompt, "", False)])
    out = policy(input_ids=ids, use_cache=True)
    p_cache, logits = out.past_key_values, out.logits[:, -1].float()
    caches = []
    for scorer in (reward, cost):
        backbone = getattr(scorer, scorer.base_model_prefix)
        caches.append(backbone(input_ids=ids, use_cache=True).past_key_values)
    length, tokens = ids.shape[1], []
    for _ in range(new_tokens):
        top_lp, top_ids = torch.log_softmax(logits, -1).topk(k, dim=-1)
        scores, expanded = [], []
        for scorer, cache in zip((reward, cost), caches, strict=True):
            backbone = getattr(scorer, scorer.base_model_prefix)
            big = _expand(cache, k)
            hidden = backbone(input_ids=top_ids.view(k, 1), past_key_values=big, use_cache=True,
                              position_ids=torch.full((k, 1), length)).last_hidden_state
            scores.append(scorer.score(hidden[:, -1]).squeeze(-1).float())
            expanded.append(big)
        total = top_lp[0] + w * (scores[0] - lam * scores[1])
        choice = int(total.argmax())
        token = int(top_ids[0, choice])
        tokens.append(token)
        caches = [_select(big, choice) for big in expanded]
        out = policy(input_ids=torch.tensor([[token]]), past_key_values=p_cache, use_cache=True,
                     position_ids=torch.tensor([[length]]))
        p_cache, logits = out.past_key_values, out.logits[:, -1].float()
        length += 1
    return tokens


def floor_time(policy, reward, cost, tok, prompts, k: int, new_tokens: int) -> float:
    """Seconds of only the forwards a decoding step cannot avoid, at every step's length: the policy's
    one-token cached step of the batch and one pass of the k candidates through each scorer against its
    prefix cache (lara's own forward calls, timed alone: no top-k, no host copies, no cache surgery)."""
    import torch

    from lara.decode.rgtg import CachedSequenceScorer, PolicyStepper
    from lara.scoring import encode, pad_batch

    b = len(prompts)
    ids, mask = pad_batch([encode(tok, p, "", False) for p in prompts], tok.pad_token_id, side="left")
    pol, scorers = PolicyStepper(policy), [CachedSequenceScorer(m) for m in (reward, cost)]
    for m in (pol, *scorers):
        m.start(ids, mask)
    cand = torch.randint(0, policy.config.vocab_size, (b, k), generator=torch.Generator().manual_seed(0))
    choice, alive = torch.zeros(b, dtype=torch.long), torch.ones(b, dtype=torch.bool)
    elapsed = 0.0
    for _ in range(new_tokens):
        t0 = time.perf_counter()
        for sc in scorers:
            sc.candidates(cand)
        pol.commit(cand[:, 0], choice, alive)
        elapsed += time.perf_counter() - t0
        for sc in scorers:  # keep the chosen candidate (bookkeeping, not timed)
            sc.commit(cand[:, 0], choice, alive)
    return elapsed


def main(argv=None) -> None:
    import numpy as np
    import pandas as pd
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from lara.decode.rgtg import RGTGSettings, decode

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="results/tiny/models", help="a toy run's models directory")
    p.add_argument("--smollm2", default=None, help="use this causal LM as policy and as scorer backbone instead")
    p.add_argument("--top-k", type=int, default=50)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1, help="torch threads (a job's cpus_per_task)")
    p.add_argument("--repeats", type=int, default=3, help="rounds over every case; each case's best time counts")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.smollm2:
        tok = AutoTokenizer.from_pretrained(args.smollm2)
        policy = AutoModelForCausalLM.from_pretrained(args.smollm2).eval()
        torch.manual_seed(0)
        reward = AutoModelForSequenceClassification.from_pretrained(args.smollm2, num_labels=1).eval()
        cost = AutoModelForSequenceClassification.from_pretrained(args.smollm2, num_labels=1).eval()
        prompts = ["How do I bake bread?", "Give me a tip for sleeping better.", "How can I save money?",
                   "What should I pack for a hike?"] * 2
    else:
        tok = AutoTokenizer.from_pretrained(f"{args.models}/sft")
        policy = AutoModelForCausalLM.from_pretrained(f"{args.models}/sft").eval()
        reward = AutoModelForSequenceClassification.from_pretrained(f"{args.models}/reward").eval()
        cost = AutoModelForSequenceClassification.from_pretrained(f"{args.models}/cost").eval()
        prompts = pd.read_parquet(f"{args.models}/../data/prompts_test.parquet")["prompt"].tolist()[:8]
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    for m in (policy, reward, cost):
        m.config.pad_token_id = tok.pad_token_id
    lam, k, w, n = 0.5, args.top_k, 2.0, args.new_tokens
    tokens = len(prompts) * n

    def reference():
        return [reference_decode(policy, reward, cost, tok, q, lam, k, w, n) for q in prompts]

    def cached(b):
        s = RGTGSettings(top_k=k, weight=w, temperature=0.0, max_new_tokens=n, batch_size=b, stop_at_eos=False)
        return decode(policy, reward, cost, tok, prompts, lam, s)

    def generate(b):
        for lo in range(0, len(prompts), b):
            enc = tok(prompts[lo:lo + b], return_tensors="pt", padding=True, padding_side="left")
            policy.generate(**enc, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=tok.pad_token_id)

    # every case once per round, rounds repeated: the best time of each case (this machine's timings
    # wander by tens of percent from run to run; interleaving keeps a slow spell from hitting one case)
    best, same, ref = {}, True, None
    with torch.inference_mode():
        for _ in range(args.repeats):
            for case, fn in [("reference", reference), ("cached1", lambda: cached(1)), ("cached8", lambda: cached(8)),
                             ("generate1", lambda: generate(1)), ("generate8", lambda: generate(8))]:
                t0 = time.perf_counter()
                got = fn()
                best[case] = min(best.get(case, np.inf), time.perf_counter() - t0)
                if case == "reference":
                    same &= ref is None or got == ref
                    ref = got
                elif case.startswith("cached"):
                    same &= got == ref
            for b in (1, 8):
                spent = sum(floor_time(policy, reward, cost, tok, prompts[lo:lo + b], k, n)
                            for lo in range(0, len(prompts), b))
                best[f"floor{b}"] = min(best.get(f"floor{b}", np.inf), spent)
    rate = {case: tokens / t for case, t in best.items()}
    ref_rate = rate["reference"]
    rates, floors = ({b: rate[f"{case}{b}"] for b in (1, 8)} for case in ("cached", "floor"))
    rows = [("reference (one prompt at a time)", ref_rate, ref_rate), ("cached (lara)", rates[1], rates[8]),
            ("floor (unavoidable forwards)", floors[1], floors[8]),
            ("generate (policy alone)", rate["generate1"], rate["generate8"])]
    print(f"{len(prompts)} prompts x {n} new tokens, k = {k}, {args.threads} thread(s), best of {args.repeats} "
          "rounds; tokens/s")
    print(f"{'':32s} {'batch 1':>9s} {'batch 8':>9s}")
    for name, a, b8 in rows:
        print(f"{name:32s} {a:9.1f} {b8:9.1f}")
    print(f"identical tokens (cached at batch 1 and 8 vs reference): {same}")
    print(f"cached / reference: {rates[1] / ref_rate:.2f}x at batch 1, {rates[8] / ref_rate:.2f}x at batch 8; "
          f"floor / cached (step time over the floor): {floors[1] / rates[1]:.2f}x at batch 1, "
          f"{floors[8] / rates[8]:.2f}x at batch 8")


if __name__ == "__main__":
    main()
