"""The fault catalogue: every bad input and fault case of the audit, each run through the real
entry point (a `lara` command, or Snakemake's dry run for the workflow's own checks) and held to
the same three things: the exit status, a message that names the key, file, column or row, and no
output left behind (nothing half-written). Cases that need a trained model or a killed job live
beside their code (test_resume.py: checkpoints killed while saving; test_judge.py: the judge's
endpoint faults; test_trail.py: provenance holes) and are listed in README "When things go wrong"."""

import json
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pytest
import yaml

from lara.decode.rgtg import RGTGSettings

from ..conftest import REPO, copy_workflow, run_snakemake


def lara(*args, env=None):
    import os

    return subprocess.run([sys.executable, "-m", "lara", *map(str, args)], capture_output=True, text=True,
                          env=None if env is None else os.environ | env)


def candidates(n_prompts=3, n=4, seed=0):
    rng = np.random.default_rng(seed)
    rows = [{"prompt_id": f"p{i}", "sample_id": k, "prompt": f"q{i}", "response": f"a{i}{k}",
             "reward": rng.normal(), "cost": rng.normal()} for i in range(n_prompts) for k in range(n)]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------
# inputs, each written into the case's folder; a case's argv refers to them by name


def _cand(t, change=None):
    df = candidates()
    for (row, col), value in (change or {}).items():
        df.loc[row, col] = value
    df.to_parquet(t / "cand.parquet")


def _write(name, content):
    def make(t):
        (t / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return make


def _frame(name, df):
    return lambda t: df.to_parquet(t / name)


PAIRS = [{"prompt": f"q{i}", "response_0": "a", "response_1": "b", "better_response_id": 0, "safer_response_id": 0,
          "is_response_0_safe": i != 2, "is_response_1_safe": True} for i in range(5)]
SFT_LINE = json.dumps({"instruction": "a", "input": "", "output": "x"})


@dataclass
class Case:
    name: str
    make: list  # functions writing the inputs into the case's folder
    argv: list  # after `lara`; "{t}" is the case's folder
    rc: int
    messages: list  # each must appear in stderr + stdout
    absent: list = field(default_factory=list)  # outputs that must not exist afterwards
    env: dict | None = None


def nan_reward(t):
    _cand(t, {(5, "reward"): np.nan})


def inf_cost(t):
    _cand(t, {(7, "cost"): np.inf})


def duplicated(t):
    pd.concat([candidates(), candidates().iloc[[2]]], ignore_index=True).to_parquet(t / "cand.parquet")


def infeasible(t):
    df = candidates()
    df["cost"] = df["cost"].abs() + 1
    df.to_parquet(t / "cand.parquet")


def responses(t):
    candidates().assign(method="bon", setting="star", **{"lambda": 0.1}).to_parquet(t / "resp.parquet")


def pairs(t):
    (t / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in PAIRS))


def pool(t):
    pd.DataFrame({"prompt": [f"question {i}" for i in range(20)]}).to_json(t / "pool.jsonl", orient="records",
                                                                         lines=True)


def sidecar(t):
    (t / "fig.provenance.json").write_text('{"figure": [')


CAL = ["calibrate", "--scores", "{t}/cand.parquet", "--tau", "0", "--bootstrap", "20", "--out", "{t}/lambda.json"]
SEL = ["select-bon", "--candidates", "{t}/cand.parquet", "--overpenalised-lambda", "5", "--out", "{t}/out.parquet"]
PREP = ["prepare-data", "--kind", "sft", "--out", "{t}/sft.parquet", "--source"]
SPLIT = ["split-prompts", "--n-calibration", "5", "--calibration", "{t}/cal.parquet", "--test", "{t}/test.parquet"]
MODEL_ARGS = ["--data", "{t}/cand.parquet", "--checkpoints", "{t}/ck", "--out", "{t}/model"]
JUDGE = ["judge", "--responses", "{t}/resp.parquet", "--out", "{t}/judge.parquet"]
CONFIG = str(REPO / "config" / "config.yaml")

CASES = [
    # calibration input
    Case("calibrate: a missing column", [lambda t: candidates().drop(columns="cost").to_parquet(t / "cand.parquet")],
         CAL, 2, ["cand.parquet: missing column(s) cost"], ["lambda.json"]),
    Case("calibrate: an infinite cost", [inf_cost], CAL, 2,
         ["cand.parquet: column 'cost' holds a non-finite value (inf) at row 7"], ["lambda.json"]),
    Case("calibrate: duplicated (prompt_id, sample_id) rows", [duplicated], [*CAL[:-2], "--mode", "bon", *CAL[-2:]],
         2, ["counted twice", "rows [2, 12]"], ["lambda.json"]),
    Case("calibrate: tau out of reach", [infeasible], CAL, 2, ["tau=0.0 is not reachable", "--allow-infeasible"],
         ["lambda.json"]),
    Case("calibrate: no such file", [], CAL, 2, ["cand.parquet: file not found"], ["lambda.json"]),
    Case("calibrate: not a parquet file", [_write("cand.parquet", b"not parquet")], CAL, 2,
         ["cand.parquet: could not be read"], ["lambda.json"]),
    Case("calibrate: quantile out of range", [_cand], [*CAL, "--quantile", "1.5"], 2,
         ["calibration.quantile: 1.5 is greater than or equal to the maximum of 1"], ["lambda.json"]),
    Case("calibrate: --settings not JSON", [_cand], [*CAL, "--settings", "{not json"], 2,
         ["--settings: not valid JSON"], ["lambda.json"]),
    Case("calibrate: an unknown settings key", [_cand], [*CAL, "--settings", '{"tua": 1}'], 2,
         ["--settings: unknown key calibration.tua"], ["lambda.json"]),
    # Best-of-N selection and the sweep
    Case("select-bon: a NaN reward", [nan_reward], [*SEL, "--setting", "zero"], 2,
         ["cand.parquet", "column 'reward' holds a non-finite value (nan)", "'p1'"], ["out.parquet"]),
    Case("select-bon: duplicated samples", [duplicated], [*SEL, "--setting", "zero"], 2,
         ["repeat a (prompt_id, sample_id)", "('p0', 2)"], ["out.parquet"]),
    Case("select-bon: a corrupt lambda.json", [_cand, _write("lambda.json", "{broken")],
         [*SEL, "--setting", "star", "--lambda-json", "{t}/lambda.json"], 2,
         ["lambda.json: not a readable lambda.json"], ["out.parquet"]),
    Case("select-bon: lambda.json without lambda_star", [_cand, _write("lambda.json", '{"lambda_hat": 1}')],
         [*SEL, "--setting", "star", "--lambda-json", "{t}/lambda.json"], 2,
         ["lambda.json: missing key(s)", "lambda_star"], ["out.parquet"]),
    Case("select-bon: star without lambda.json", [_cand], [*SEL, "--setting", "star"], 2,
         ["--setting star", "pass --lambda-json"], ["out.parquet"]),
    Case("select-bon: an unknown lambda setting", [_cand], [*SEL, "--setting", "lots"], 2,
         ["--setting 'lots'", "zero, star, max or a literal"], ["out.parquet"]),
    Case("bon-sweep: a grid that is not JSON", [_cand],
         ["bon-sweep", "--candidates", "{t}/cand.parquet", "--lambda-grid", "[0, one]", "--bootstrap", "10",
          "--out", "{t}/sweep.csv"], 2, ["--lambda-grid: not JSON: '[0, one]'"], ["sweep.csv"]),
    Case("bon-sweep: a negative lambda", [_cand],
         ["bon-sweep", "--candidates", "{t}/cand.parquet", "--lambda-grid", "[0, -1]", "--bootstrap", "10",
          "--out", "{t}/sweep.csv"], 2, ["decode.lambda_grid: -1 is less than the minimum of 0"], ["sweep.csv"]),
    # data ingestion and splits
    Case("prepare-data: not UTF-8", [_write("a.jsonl", (SFT_LINE + "\n").encode() + b'{"instruction": "caf\xe9"}\n')],
         [*PREP, "{t}/a.jsonl"], 2, ["a.jsonl: line 2 is not UTF-8 (byte 0xe9"], ["sft.parquet"]),
    Case("prepare-data: a broken JSON line", [_write("a.jsonl", SFT_LINE + '\n{"instruction": "b", \n')],
         [*PREP, "{t}/a.jsonl"], 2, ["a.jsonl: line 2 is not valid JSON"], ["sft.parquet"]),
    Case("prepare-data: a line that is not an object", [_write("a.jsonl", SFT_LINE + "\n[1, 2]\n")],
         [*PREP, "{t}/a.jsonl"], 2, ["a.jsonl: line 2 is not a JSON object"], ["sft.parquet"]),
    Case("prepare-data: a missing column", [_write("a.jsonl", '{"question": "a", "output": "x"}\n')],
         [*PREP, "{t}/a.jsonl"], 2, ["a.jsonl: missing column(s) instruction"], ["sft.parquet"]),
    Case("prepare-data: an empty file", [_write("a.jsonl", "")], [*PREP, "{t}/a.jsonl"], 2,
         ["a.jsonl: the file is empty"], ["sft.parquet"]),
    Case("prepare-data: no such source", [], [*PREP, "{t}/nowhere.jsonl"], 2,
         ["nowhere.jsonl: file not found"], ["sft.parquet"]),
    Case("prepare-data: inconsistent safety labels", [pairs],
         ["prepare-data", "--kind", "preferences", "--source", "{t}/pairs.jsonl", "--out", "{t}/pref.parquet"], 2,
         ["pairs.jsonl: column 'safer_response_id' names the unsafe response", "at row 2",
          "data.preferences.inconsistent: drop"], ["pref.parquet"]),
    Case("split-prompts: an empty test split", [pool], [*SPLIT, "--source", "{t}/pool.jsonl", "--n-test", "0"], 2,
         ["data.prompts.n_test: 0 is less than the minimum of 1"], ["cal.parquet", "test.parquet"]),
    Case("split-prompts: not UTF-8", [_write("pool.jsonl", b'{"prompt": "\xff"}\n')],
         [*SPLIT, "--source", "{t}/pool.jsonl", "--n-test", "1"], 2, ["pool.jsonl: line 1 is not UTF-8"],
         ["cal.parquet", "test.parquet"]),
    # models and decoding
    Case("train-sft: no such model", [_cand], ["train-sft", "--model", "{t}/nomodel", *MODEL_ARGS], 2,
         ["--model", "nomodel: no such model directory"], ["model", "ck"]),
    Case("train-sft: a folder that is not a model", [_cand, lambda t: (t / "half").mkdir()],
         ["train-sft", "--model", "{t}/half", *MODEL_ARGS], 2, ["half: not a model directory (no config.json)"],
         ["model", "ck"]),
    Case("train-sft: a negative learning rate", [_cand],
         ["train-sft", "--model", "{t}/nomodel", *MODEL_ARGS, "--learning-rate", "-1"], 2,
         ["train.sft.learning_rate: -1.0 is less than or equal to the minimum of 0"], ["model", "ck"]),
    Case("sample: a file given as the model", [_cand],
         ["sample", "--model", "{t}/cand.parquet", "--prompts", "{t}/cand.parquet", "--n", "2", "--out",
          "{t}/s.parquet"], 2, ["--model", "a model is a directory"], ["s.parquet"]),
    Case("rgtg: a negative temperature", [lambda t: pd.DataFrame({"prompt_id": ["p0"], "prompt": ["hi"]})
                                          .to_parquet(t / "prompts.parquet")],
         ["rgtg", "--method", "args", "--policy", "{t}/none", "--reward", "{t}/none", "--cost", "{t}/none",
          "--prompts", "{t}/prompts.parquet", "--setting", "zero", "--overpenalised-lambda", "5",
          "--settings", '{"temperature": -1}', "--out", "{t}/out.parquet"], 2,
         ["decode.rgtg.args.temperature: -1 is less than the minimum of 0"], ["out.parquet"]),
    Case("rgtg: no such policy", [lambda t: pd.DataFrame({"prompt_id": ["p0"], "prompt": ["hi"]})
                                  .to_parquet(t / "prompts.parquet")],
         ["rgtg", "--method", "args", "--policy", "{t}/none", "--reward", "{t}/none", "--cost", "{t}/none",
          "--prompts", "{t}/prompts.parquet", "--setting", "zero", "--overpenalised-lambda", "5",
          "--out", "{t}/out.parquet"],
         2, ["--policy", "none: no such model directory"], ["out.parquet"]),
    # evaluation
    Case("evaluate: missing columns", [_cand],
         ["evaluate", "--responses", "{t}/cand.parquet", "--reward-model", "oracle", "--cost-model", "oracle",
          "--out", "{t}/scores.parquet"], 2, ["cand.parquet: missing column(s) method, setting, lambda"],
         ["scores.parquet"]),
    Case("evaluate: an unknown scorer", [responses],
         ["evaluate", "--responses", "{t}/resp.parquet", "--reward-model", "nosuch", "--cost-model", "oracle",
          "--out", "{t}/scores.parquet"], 2, ["reward scorer 'nosuch'", "named: oracle"], ["scores.parquet"]),
    Case("judge: no endpoint", [responses], [*JUDGE, "--model", "gpt-x"], 2,
         ["evaluation.judge.base_url is not set"], ["judge.parquet"]),
    Case("judge: the API key is not set", [responses],
         [*JUDGE, "--model", "gpt-x", "--base-url", "http://127.0.0.1:9/v1", "--api-key-env", "LARA_NO_SUCH_KEY",
          "--cache", "{t}/cache.sqlite"], 2, ["evaluation.judge.api_key_env", "LARA_NO_SUCH_KEY is not set"],
         ["judge.parquet"]),
    Case("judge: a failure share above 1", [responses], [*JUDGE, "--max-failure-share", "1.5"], 2,
         ["evaluation.judge.max_failure_share: 1.5 is greater than the maximum of 1"], ["judge.parquet"]),
    Case("trail: a corrupt sidecar", [sidecar], ["trail", "{t}/fig.png"], 2,
         ["fig.provenance.json: not a provenance sidecar"]),
    Case("trail: no sidecar", [], ["trail", "{t}/fig.png"], 2, ["fig.provenance.json: no provenance sidecar"]),
    # configuration files
    Case("config: a misspelt key", [_write("c.yaml", "calibraton: {tau: 1}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["unknown key calibraton"]),
    Case("config: a value out of range", [_write("c.yaml", "calibration: {quantile: 2}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2,
         ["c.yaml: invalid configuration", "calibration.quantile: 2 is greater than or equal to the maximum of 1"]),
    Case("config: not YAML", [_write("c.yaml", "calibration: [unclosed\n")], ["validate-config", "{t}/c.yaml"], 2,
         ["c.yaml: not valid YAML"]),
    Case("config: no such file", [], ["validate-config", "{t}/c.yaml"], 2, ["c.yaml: config file not found"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault(case, tmp_path):
    for make in case.make:
        make(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    proc = lara(*[a.replace("{t}", str(tmp_path)) for a in case.argv], env=case.env)
    out = proc.stderr + proc.stdout
    assert proc.returncode == case.rc, out[-3000:]
    for message in case.messages:
        assert message in out, f"{message!r} not in:\n{out[-3000:]}"
    assert "Traceback" not in out
    for name in case.absent:
        assert not (tmp_path / name).exists(), f"{name} was left behind"
    left = {p.name for p in tmp_path.iterdir()} - before - {"cache.sqlite"}
    assert not [n for n in left if n.startswith(".") and n.endswith(".tmp")], f"temporary files left: {left}"


# ---------------------------------------------------------------------------------------------
# the workflow's own checks, before any job runs (Snakemake's dry run)

WORKFLOW_CASES = [
    ("more training processes than GPUs", {"resources": {"rules": {"train_sft": {"gpu": 2, "processes": 3,
                                                                                 "cpus_per_task": 8}}}},
     ["resources.rules.train_sft.processes: 3 processes for 2 GPUs"]),
    ("more training processes than CPUs", {"resources": {"rules": {"train_cost_model": {"processes": 4}}}},
     ["resources.rules.train_cost_model.processes: 4 processes need at least as many CPUs (cpus_per_task is 1)"]),
    ("a misspelt rule under resources.rules", {"resources": {"rules": {"train_sfft": {"gpu": 1}}}},
     ["resources.rules: unknown rule train_sfft"]),
    ("a local base model that is not there", {"base_model": {"name_or_path": "./models/llama"}},
     ["base_model.name_or_path: './models/llama' looks like a local model path, and there is nothing there"]),
    ("top_k beyond the vocabulary", {"decode": {"rgtg": {"args": {"top_k": 5000}}}},
     ["decode.rgtg.args.top_k: 5000 candidate tokens per step exceed the vocabulary of 1024"]),
    ("a value out of range", {"calibration": {"bootstrap": 0}}, ["calibration.bootstrap: 0 is less than"]),
    ("Best-of-N larger than K", {"decode": {"bon_n": 64}}, ["decode.bon_n: Best-of-N with N = 64"]),
]


@pytest.fixture(scope="module")
def dry_workflow(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("faults") / "wf")


@pytest.mark.parametrize("name, override, messages", WORKFLOW_CASES, ids=[c[0] for c in WORKFLOW_CASES])
def test_workflow_fault(dry_workflow, tmp_path, name, override, messages):
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(override))
    proc = run_snakemake(dry_workflow, "-n", "--configfile", str(tmp_path / "c.yaml"), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    for message in messages:
        assert message in out, f"{message!r} not in:\n{out[-3000:]}"
    assert not (dry_workflow / "results").exists() and not (dry_workflow / "logs").exists()


def test_costs_exactly_at_tau_are_feasible_despite_rounding(tmp_path):
    df = candidates()
    df["cost"] = -0.3  # every sample exactly at the budget: feasible at lambda = 0
    df.to_parquet(tmp_path / "cand.parquet")
    proc = lara("calibrate", "--scores", tmp_path / "cand.parquet", "--tau", -0.3, "--bootstrap", 20,
                "--out", tmp_path / "lambda.json")
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "lambda.json").read_text())
    assert record["feasible"] is True and record["lambda_hat"] == 0.0


@pytest.mark.parametrize("key,value", [("temperature", -1.0), ("top_k", 0), ("max_new_tokens", 0), ("weight", -2.0)])
def test_decode_settings_out_of_range_name_the_key(key, value):
    message = rf"invalid settings: decode\.rgtg\.{key}: {value!r} is less than the minimum"
    with pytest.raises(ValueError, match=message):
        RGTGSettings(**{key: value})


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
