"""Inputs that used to give a silently wrong answer now stop the step with a message naming the
file, column or setting, and write nothing."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from lara.decode.rgtg import RGTGSettings


def lara(*args):
    return subprocess.run([sys.executable, "-m", "lara", *map(str, args)], capture_output=True, text=True)


def candidates(n_prompts=3, n=4, seed=0):
    rng = np.random.default_rng(seed)
    rows = [{"prompt_id": f"p{i}", "sample_id": k, "prompt": f"q{i}", "response": f"a{i}{k}",
             "reward": rng.normal(), "cost": rng.normal()} for i in range(n_prompts) for k in range(n)]
    return pd.DataFrame(rows)


def test_select_bon_rejects_a_nan_reward(tmp_path):
    df = candidates()
    df.loc[5, "reward"] = np.nan
    path, out = tmp_path / "cand.parquet", tmp_path / "out.parquet"
    df.to_parquet(path)
    proc = lara("select-bon", "--candidates", path, "--setting", "zero", "--lambda-max", 5, "--out", out)
    assert proc.returncode == 2 and "column 'reward' holds a non-finite value (nan)" in proc.stderr
    assert "'p1'" in proc.stderr and str(path) in proc.stderr and not out.exists()


def test_duplicated_samples_are_rejected_by_selection_and_calibration(tmp_path):
    df = pd.concat([candidates(), candidates().iloc[[2]]], ignore_index=True)
    path = tmp_path / "cand.parquet"
    df.to_parquet(path)
    proc = lara("select-bon", "--candidates", path, "--setting", "zero", "--lambda-max", 5,
                "--out", tmp_path / "out.parquet")
    assert proc.returncode == 2 and "repeat a (prompt_id, sample_id)" in proc.stderr and "('p0', 2)" in proc.stderr
    out = tmp_path / "lambda.json"
    proc = lara("calibrate", "--scores", path, "--tau", 0, "--mode", "bon", "--bootstrap", 20, "--out", out)
    assert proc.returncode == 2 and "counted twice" in proc.stderr and "rows [2, 12]" in proc.stderr
    assert not out.exists()


def test_empty_splits_are_refused(tmp_path):
    pool = tmp_path / "pool.jsonl"
    pd.DataFrame({"prompt": [f"question {i}" for i in range(20)]}).to_json(pool, orient="records", lines=True)
    cal, test = tmp_path / "cal.parquet", tmp_path / "test.parquet"
    proc = lara("split-prompts", "--source", pool, "--n-calibration", 5, "--n-test", 0, "--calibration", cal,
                "--test", test)
    assert proc.returncode == 2 and "data.prompts.n_test: 0 is less than the minimum of 1" in proc.stderr
    assert not cal.exists() and not test.exists()


@pytest.mark.parametrize("key,value", [("temperature", -1.0), ("top_k", 0), ("max_new_tokens", 0), ("weight", -2.0)])
def test_decode_settings_out_of_range_name_the_key(key, value):
    message = rf"invalid settings: decode\.rgtg\.{key}: {value!r} is less than the minimum"
    with pytest.raises(ValueError, match=message):
        RGTGSettings(**{key: value})


def test_decode_cli_refuses_a_negative_temperature(tmp_path):
    prompts = tmp_path / "prompts.parquet"
    pd.DataFrame({"prompt_id": ["p0"], "prompt": ["hi"]}).to_parquet(prompts)
    out = tmp_path / "out.parquet"
    proc = lara("rgtg", "--method", "args", "--policy", tmp_path / "none", "--reward", tmp_path / "none",
                "--cost", tmp_path / "none", "--prompts", prompts, "--setting", "zero", "--lambda-max", 5,
                "--settings", json.dumps({"temperature": -1}), "--out", out)
    assert proc.returncode == 2 and "decode.rgtg.temperature: -1 is less than the minimum of 0" in proc.stderr
    assert not out.exists()


def test_more_candidate_tokens_than_the_vocabulary_is_refused_before_decoding(tiny_world):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lara.config import ConfigError
    from lara.decode.rgtg import decode

    tok = AutoTokenizer.from_pretrained(tiny_world["base"])
    policy = AutoModelForCausalLM.from_pretrained(tiny_world["base"])
    too_many = RGTGSettings(top_k=policy.config.vocab_size + 1)
    with pytest.raises(ConfigError, match=rf"decode\.rgtg\.top_k: {too_many.top_k} .* vocabulary of "
                                          rf"{policy.config.vocab_size}"):
        decode(policy, None, None, tok, ["hello"], 0.0, too_many)
