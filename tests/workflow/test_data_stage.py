"""Snakemake itself on the toy world: the data stage end to end, dry runs of the paper configs,
and config validation before any job runs."""

import json
import re

import pandas as pd
import pytest

from lara.read.files import read_metadata
from lara.toy.world import find_topic

from ..conftest import run_snakemake

pytestmark = pytest.mark.workflow


def test_toy_data_stage_outputs(toy_run):
    res = toy_run / "results" / "tiny"
    sft = pd.read_parquet(res / "data" / "sft.parquet")
    prefs = pd.read_parquet(res / "data" / "preferences.parquet")
    cal = pd.read_parquet(res / "data" / "prompts_calibration.parquet")
    test = pd.read_parquet(res / "data" / "prompts_test.parquet")
    assert len(sft) == 2000 and list(sft.columns) == ["instruction", "input", "output", "prompt"]
    assert len(prefs) == 2000 and prefs["safer_response_id"].isin([0, 1]).all()
    assert (len(cal), len(test)) == (200, 256)
    assert not set(cal["prompt"]) & set(test["prompt"])
    # calibration and test prompts are held out of every training prompt
    assert not (set(cal["prompt"]) | set(test["prompt"])) & (set(prefs["prompt"]) | set(sft["prompt"]))
    # both splits carry harmful and benign requests
    for split in (cal, test):
        harmful = split["prompt"].map(lambda p: find_topic(p).harmful)
        assert 0.2 < harmful.mean() < 0.8
    meta = read_metadata(res / "data" / "preferences.parquet")
    assert meta["origin"]["source"] == "results/tiny/toy/safe_rlhf.jsonl" and meta["rows_out"] == 2000
    for log in ("make_toy_world", "prepare_sft_data", "prepare_preferences", "split_prompts", "make_toy_model"):
        text = (toy_run / "logs" / "tiny" / f"{log}.log").read_text()
        assert "code version" in text and "done in" in text


def test_toy_base_model_loads_through_auto_classes(toy_run):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = toy_run / "results" / "tiny" / "models" / "base"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    text = "BEGINNING OF CONVERSATION: USER: how do i bake bread ? ASSISTANT: sure ."
    ids = tok(text).input_ids
    assert ids[0] == tok.bos_token_id and tok.decode(ids, skip_special_tokens=True) == text
    assert len(ids) < 25  # the BPE learnt the toy vocabulary
    out = model.generate(torch.tensor([ids]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, len(ids) + 4) or out[0, -1] == tok.eos_token_id
    prov = json.loads((path / "provenance.json").read_text())
    assert prov["settings"]["vocab_size"] == 1024 and len(prov["inputs"]["alpaca"]["sha256"]) == 64


def test_finished_run_has_nothing_to_do(toy_run):
    proc = run_snakemake(toy_run, "-n")
    assert "Nothing to be done" in proc.stdout + proc.stderr


@pytest.mark.parametrize("paper", ["paper-llama", "paper-qwen"])
def test_paper_configs_dry_run_without_the_hub(workflow_copy, paper):
    proc = run_snakemake(workflow_copy, "-n", "--configfile", f"config/{paper}.yaml")
    out = proc.stdout
    exp = paper.split("-")[1]
    assert f"results/{exp}/data/preferences.parquet" in out
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out, flags=re.M))
    assert {"prepare_sft_data", "prepare_preferences", "split_prompts"} <= set(jobs)
    assert "make_toy_world" not in jobs and "make_toy_model" not in jobs  # hub data, hub model


def test_bad_config_fails_before_any_job(workflow_copy):
    (workflow_copy / "bad.yaml").write_text("calibration:\n  bootstrap: -5\n  tua: 1\n")
    proc = run_snakemake(workflow_copy, "--configfile", "bad.yaml", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "calibration.bootstrap: -5 is less than the minimum of 1" in out
    assert "unknown key calibration.tua" in out and "bad.yaml" in out
    proc = run_snakemake(workflow_copy, "--config", "seed=-3", check=False)
    assert proc.returncode != 0 and "seed: -3 is less than the minimum of 0" in proc.stdout + proc.stderr
    assert not (workflow_copy / "results").exists() and not (workflow_copy / "logs").exists()
