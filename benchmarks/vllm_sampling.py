"""vLLM against transformers' batched sampling on real-text calibration sampling (issue 56), on a CPU.

    .venv-vllm/bin/python benchmarks/vllm_sampling.py --model ~/.cache/lara-tests/smollm2-135m-instruct \\
        --prompts-file ~/.cache/lara-tests/rtp-prompts.jsonl [--prompts 40 --k 8 --max-new-tokens 32] [--out JSON]

The real-text experiment's calibration sampling (config/real-text.yaml): RealToxicityPrompts prompts, K = 8
responses each, 32 new tokens, temperature 1.2, top-k 50, float32, seeded. Each backend runs in a fresh process of
its own (so its start-up and memory are its own), one after the other:

* ``hf``: :class:`lara.sample.HFGenerator` (transformers ``generate``, left-padded batches of ``batch_size`` = 32
  sequences, 4 prompts x 8);
* ``vllm``: :class:`lara.sample.VLLMGenerator` as ``lara sample --backend vllm`` runs it on a CPU (eager, unsplit
  prefills, per-request seeds, prefix caching, every prompt in one call);
* ``vllm-unseeded``: vLLM's own defaults on a CPU beside eager mode (chunked prefill on, no per-request seed, so
  not reproducible request by request), to show what the seeded configuration costs.

Threads: vLLM's CPU worker binds its compute threads itself (VLLM_CPU_OMP_THREADS_BIND=auto; on this 2-core
machine one core, the other kept for its front end); the hf row gets ``--hf-threads`` (1 by default, the same).
Two torch threads on two cores already busy with other jobs made transformers ~10x slower here (spinning OpenMP).

Printed, measured in this run: generated tokens, generation seconds, tokens/s, start-up seconds (process start to a
ready generator: imports, model load, engine start), peak resident memory of the process tree (the sum of the RSS of
the process and its children, sampled every 0.1 s; shared pages count once per process), and the ratios against
hf. Needs the vLLM environment (``make vllm-env``; its transformers is 5.19, the hf row runs on it too).
"""

from __future__ import annotations

import time

T0 = time.time()

import argparse  # noqa: E402
import contextlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

BACKENDS = ("hf", "vllm", "vllm-unseeded")
CACHE = Path(os.environ.get("LARA_TEST_CACHE", Path.home() / ".cache" / "lara-tests"))


def read_prompts(path: str, n: int) -> list[str]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [r["prompt"] for r in rows[:n]]


def unseeded_vllm(model: str):
    """vLLM with its CPU defaults beside eager mode: chunked prefill on, requests unseeded (the engine's seed)."""
    from vllm import LLM, SamplingParams

    from lara.sample import COLUMNS, GiB
    from lara.template import format_prompt

    llm = LLM(model=model, dtype="float32", enable_prefix_caching=True, enforce_eager=True,
              kv_cache_memory_bytes=2 * GiB)

    def generate(prompt_ids, prompts, n, s, seed):
        import pandas as pd

        params = SamplingParams(n=n, temperature=s.temperature, top_k=s.top_k or -1, max_tokens=s.max_new_tokens)
        outs = llm.generate([format_prompt(p) for p in prompts], params)
        return pd.DataFrame([(pid, k, p, o.text.strip(), len(o.token_ids)) for pid, p, out in
                             zip(prompt_ids, prompts, outs, strict=True) for k, o in enumerate(out.outputs)],
                            columns=COLUMNS)

    return generate


def worker(args) -> None:
    """One backend in this process: prints one JSON line with its start-up, tokens and generation time."""
    from lara.sample import GenerationSettings, make_generator

    s = GenerationSettings(top_k=50, temperature=1.2, max_new_tokens=args.max_new_tokens, batch_size=32, seed=0)
    prompts = read_prompts(args.prompts_file, args.prompts)
    if args.worker == "vllm-unseeded":
        generate = unseeded_vllm(args.model)
    else:
        generate = make_generator(args.worker, args.model, "float32").generate
    startup = time.time() - T0
    t = time.time()
    out = generate([str(i) for i in range(len(prompts))], prompts, args.k, s, s.seed)
    seconds = time.time() - t
    print("RESULT " + json.dumps({"backend": args.worker, "startup_s": startup, "generate_s": seconds,
                                  "tokens": int(out["n_tokens"].sum()), "sequences": len(out),
                                  "eos_share": float((out["n_tokens"] < args.max_new_tokens).mean())}), flush=True)
    del generate, out  # a normal exit: vLLM shuts its engine processes down (os._exit would orphan them)


def tree_rss(pid: int) -> int:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def run_backend(args, backend: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", backend, "--model", args.model, "--prompts-file",
           args.prompts_file, "--prompts", str(args.prompts), "--k", str(args.k), "--max-new-tokens",
           str(args.max_new_tokens)]
    env = dict(os.environ)
    if backend == "hf":  # one compute thread, as vLLM's CPU worker takes (below 4 cores it keeps one for itself)
        env["OMP_NUM_THREADS"] = str(args.hf_threads)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    peak, done = [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            time.sleep(0.1)

    threading.Thread(target=watch, daemon=True).start()
    stdout, stderr = proc.communicate()
    done.set()
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{backend} failed (exit {proc.returncode}):\n{stderr[-4000:]}")
    row = json.loads(lines[-1][len("RESULT "):])
    row["tokens_per_s"] = row["tokens"] / row["generate_s"]
    row["peak_rss_gib"] = peak[0] / 2**30
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=str(CACHE / "smollm2-135m-instruct"))
    ap.add_argument("--prompts-file", default=str(CACHE / "rtp-prompts.jsonl"))
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--backends", default=",".join(BACKENDS))
    ap.add_argument("--hf-threads", type=int, default=1,
                    help="torch threads of the hf row (vLLM's CPU worker binds its own: one core of two here)")
    ap.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    ap.add_argument("--out", help="write every number as JSON")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = []
    for backend in args.backends.split(","):
        rows.append(run_backend(args, backend))
        print(f"{backend:>14}: {rows[-1]['tokens']} tokens in {rows[-1]['generate_s']:.1f} s = "
              f"{rows[-1]['tokens_per_s']:.0f} tokens/s; start-up {rows[-1]['startup_s']:.1f} s; peak RSS "
              f"{rows[-1]['peak_rss_gib']:.2f} GiB; {100 * rows[-1]['eos_share']:.0f} % stopped at EOS", flush=True)
    base = next((r for r in rows if r["backend"] == "hf"), None)
    if base:
        for r in rows:
            if r is not base:
                ratio = {k: r[k] / base[k] for k in ("tokens_per_s", "startup_s", "peak_rss_gib")}
                print(f"{r['backend']} / hf: tokens/s x{ratio['tokens_per_s']:.2f}, start-up "
                      f"x{ratio['startup_s']:.2f}, peak RSS x{ratio['peak_rss_gib']:.2f}")
    setting = {k: getattr(args, k) for k in ("model", "prompts_file", "prompts", "k", "max_new_tokens")}
    if args.out:
        Path(args.out).write_text(json.dumps({"setting": setting, "cpus": os.cpu_count(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
