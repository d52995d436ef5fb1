"""The fault catalogue: every bad input and fault case of the audit, each run through the real
entry point (a `lara` command, or Snakemake's dry run for the workflow's own checks) and held to
the same three things: the exit status, a message that names the key, file, column or row, and no
output left behind (nothing half-written). Cases that need a trained model or a killed job live
beside their code (test_resume.py: checkpoints killed while saving; test_judge.py: the judge's
endpoint faults; test_trail.py: provenance holes) and are listed in docs/faults.md."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from lara.decode.rgtg import RGTGSettings

from ..conftest import REPO, Case, copy_workflow, lara_in_process, run_snakemake


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




def lambda_json(change):
    """A lambda.json as `lara calibrate` writes it (its required keys), with ``change`` applied."""
    record = {"lambda_hat": 0.05, "lambda_star": 0.1, "tau": 0.0, "mode": "bon", "feasible": True, "status": "interior",
              "decoder": {"kind": "best_of_n", "n": 4, "k": 4},
              "bootstrap": {"quantile": 0.975, "quantiles": {"0.5": 0.05, "0.975": 0.1}}}

    def make(t):
        change(record)
        (t / "lambda.json").write_text(json.dumps(record))  # json writes NaN / Infinity as JavaScript does
    return make


def missing_prompt_id(t):
    df = candidates()
    df.loc[[4, 5], "prompt_id"] = None
    df.to_parquet(t / "cand.parquet")


def stale_temporaries(t):
    """What a writer killed mid-write (SIGKILL, a time limit) leaves: its temporary file and folder."""
    import os

    _cand(t)
    for name in (".lambda.json.k1ll3d.tmp", ".lambda.json.0ld.tmp"):
        (t / name).mkdir() if name.startswith(".lambda.json.0ld") else (t / name).write_text('{"half": ')
        os.utime(t / name, (1_700_000_000, 1_700_000_000))


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


CAL = ["calibrate", "--scores", "{t}/cand.parquet", "--tau", "0", "--bootstrap", "200", "--out", "{t}/lambda.json"]
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
    Case("calibrate: a NaN beta in --settings", [_cand], [*CAL, "--settings", '{"beta": NaN, "mode": "soft"}'], 2,
         ["calibration.beta: nan is not a finite number"], ["lambda.json"]),
    Case("calibrate: a NaN tolerance flag", [_cand], [*CAL, "--tolerance", "nan"], 2,
         ["calibration.tolerance: nan is not a finite number"], ["lambda.json"]),
    Case("calibrate: an integer setting given as a float", [_cand], [*CAL, "--settings", '{"bon_n": 4.0}'], 2,
         ["decode.bon_n: 4.0 is not an integer; write 4"], ["lambda.json"]),
    Case("calibrate: a seed beyond every generator's range", [_cand], [*CAL, "--seed", str(2**45)], 2,
         ["seed: 35184372088832 is greater than the maximum of 2147483647"], ["lambda.json"]),
    Case("calibrate: rows without a prompt id", [missing_prompt_id], CAL, 2,
         ["cand.parquet: column 'prompt_id' has no value (missing, empty or infinite) at rows 4, 5"], ["lambda.json"]),
    Case("calibrate: --out is a folder", [_cand, lambda t: (t / "lambda.json").mkdir()], CAL, 2,
         ["--out", "lambda.json: is a folder; this step writes a file there (nothing was computed)"]),
    Case("calibrate: --out where nothing can be written", [_cand], [*CAL[:-1], "/proc/lambda.json"], 2,
         ["--out /proc/lambda.json: cannot write in /proc", "nothing was computed"]),
    Case("calibrate: temporaries of a killed writer", [stale_temporaries], CAL, 0, [], [".lambda.json.k1ll3d.tmp",
                                                                                        ".lambda.json.0ld.tmp"]),
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
         ["lambda.json: not a readable JSON file"], ["out.parquet"]),
    Case("select-bon: lambda.json without lambda_star", [_cand, _write("lambda.json", '{"lambda_hat": 1}')],
         [*SEL, "--setting", "star", "--lambda-json", "{t}/lambda.json"], 2,
         ["lambda.json: missing key(s)", "lambda_star"], ["out.parquet"]),
    Case("select-bon: lambda_star Infinity in lambda.json", [_cand, lambda_json(lambda r: r.update(lambda_star=1e999))],
         [*SEL, "--setting", "star", "--lambda-json", "{t}/lambda.json"], 2,
         ["lambda.json: lambda_star: not a finite number"], ["out.parquet"]),
    Case("select-bon: a hand-edited lambda_star", [_cand, lambda_json(lambda r: r.update(lambda_star=0.5))],
         [*SEL, "--setting", "star", "--lambda-json", "{t}/lambda.json"], 2,
         ["lambda.json: lambda_star = 0.5 is not the record's own bootstrap quantile 0.975 = 0.1"], ["out.parquet"]),
    Case("select-bon: a NaN over-penalised lambda", [_cand], [*SEL[:-3], "nan", "--setting", "max", *SEL[-2:]], 2,
         ["--overpenalised-lambda: decode.overpenalised_lambda: nan is not a finite number"], ["out.parquet"]),
    Case("select-bon: rows without a prompt id", [missing_prompt_id], [*SEL, "--setting", "zero"], 2,
         ["cand.parquet: column 'prompt_id' has no value (missing, empty or infinite) at rows 4, 5"], ["out.parquet"]),
    Case("select-bon: an empty table", [lambda t: candidates().iloc[:0].to_parquet(t / "cand.parquet")],
         [*SEL, "--setting", "zero"], 2, ["cand.parquet: the table has no rows"], ["out.parquet"]),
    Case("select-bon: star without lambda.json", [_cand], [*SEL, "--setting", "star"], 2,
         ["--setting star", "pass --lambda-json"], ["out.parquet"]),
    Case("select-bon: an unknown lambda setting", [_cand], [*SEL, "--setting", "lots"], 2,
         ["--setting 'lots'", "zero, hat, star, max, star_tau_<tau>"], ["out.parquet"]),
    Case("bon-sweep: a grid that is not JSON", [_cand],
         ["bon-sweep", "--candidates", "{t}/cand.parquet", "--lambda-grid", "[0, one]", "--bootstrap", "200",
          "--out", "{t}/sweep.csv"], 2, ["--lambda-grid: not JSON: '[0, one]'"], ["sweep.csv"]),
    Case("bon-sweep: rows without a prompt id", [missing_prompt_id],
         ["bon-sweep", "--candidates", "{t}/cand.parquet", "--lambda-grid", "[0, 1]", "--bootstrap", "200",
          "--out", "{t}/sweep.csv"], 2,
         ["cand.parquet: column 'prompt_id' has no value (missing, empty or infinite) at rows 4, 5"], ["sweep.csv"]),
    Case("bon-sweep: a negative lambda", [_cand],
         ["bon-sweep", "--candidates", "{t}/cand.parquet", "--lambda-grid", "[0, -1]", "--bootstrap", "200",
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
          "--out", "{t}/scores.parquet"], 2, ["reward scorer 'nosuch'", "named: fluency, hatesonar, oracle"],
         ["scores.parquet"]),
    Case("judge: no endpoint", [responses], [*JUDGE, "--model", "gpt-x"], 2,
         ["evaluation.judge.base_url is not set"], ["judge.parquet"]),
    Case("judge: the API key is not set", [responses],
         [*JUDGE, "--model", "gpt-x", "--base-url", "http://127.0.0.1:9/v1", "--api-key-env", "LARA_NO_SUCH_KEY",
          "--cache", "{t}/cache.sqlite"], 2, ["evaluation.judge.api_key_env", "LARA_NO_SUCH_KEY is not set"],
         ["judge.parquet"]),
    Case("judge: a password in the endpoint URL", [responses],
         [*JUDGE, "--model", "gpt-x", "--base-url", "https://bob:hunter2@api.example.com/v1", "--cache",
          "{t}/cache.sqlite"], 2,
         ["evaluation.judge.base_url: the URL carries credentials (user:password@)", "api_key_env"], ["judge.parquet"],
         hidden=["hunter2"]),
    Case("judge: a key in the endpoint URL's query", [responses],
         [*JUDGE, "--model", "gpt-x", "--base-url", "https://api.example.com/v1?api-key=hunter2", "--cache",
          "{t}/cache.sqlite"], 2,
         ["evaluation.judge.base_url: the URL carries credentials (the query parameter api-key)"], ["judge.parquet"],
         hidden=["hunter2"]),
    Case("aggregate: NaN harmfulness", [lambda t: candidates().assign(
        method="bon", setting="zero", helpfulness=1.0, harmfulness=[np.nan] + [0.0] * 11, **{"lambda": 0.0})
                                        .to_parquet(t / "s.parquet")],
         ["aggregate", "--scores", "{t}/s.parquet", "--tau", "0", "--out", "{t}/summary.csv", "--audit", "{t}/a.json"],
         2, ["s.parquet: column 'harmfulness' holds a non-finite value (nan) at row 0 (prompt 'p0')"],
         ["summary.csv", "a.json"]),
    Case("aggregate: an empty scores table", [lambda t: candidates().iloc[:0].assign(
        method="bon", setting="zero", helpfulness=1.0, harmfulness=0.0, **{"lambda": 0.0}).to_parquet(t / "s.parquet")],
         ["aggregate", "--scores", "{t}/s.parquet", "--tau", "0", "--out", "{t}/summary.csv", "--audit", "{t}/a.json"],
         2, ["s.parquet: the table has no rows"], ["summary.csv", "a.json"]),
    Case("figure: an empty sweep", [_write("sweep.csv", "n,lambda,label,mean_reward,mean_cost\n"),
                                    lambda_json(lambda r: None)],
         ["figure", "--kind", "lambda_sweep", "--sweep", "{t}/sweep.csv", "--lambda-json", "{t}/lambda.json",
          "--png", "{t}/f.png", "--pdf", "{t}/f.pdf", "--provenance", "{t}/f.provenance.json"], 2,
         ["sweep.csv: the table has no rows"], ["f.png", "f.pdf", "f.provenance.json"]),
    Case("figure: an empty summary", [_write("summary.csv", "method,setting,lambda,helpfulness,helpfulness_lo,"
                                                     "helpfulness_hi,harmfulness,harmfulness_lo,harmfulness_hi\n")],
         ["figure", "--kind", "tradeoff", "--summary", "{t}/summary.csv", "--png", "{t}/f.png", "--pdf", "{t}/f.pdf",
          "--provenance", "{t}/f.provenance.json"], 2, ["summary.csv: the table has no rows"],
         ["f.png", "f.pdf", "f.provenance.json"]),
    Case("judge: a failure share above 1", [responses], [*JUDGE, "--max-failure-share", "1.5"], 2,
         ["evaluation.judge.max_failure_share: 1.5 is greater than the maximum of 1"], ["judge.parquet"]),
    Case("summary: a run that has not finished", [], ["summary", "{t}/results/tiny"], 2,
         ["calibration/lambda.json: no such lambda.json"]),
    Case("trail: a corrupt sidecar", [sidecar], ["trail", "{t}/fig.png"], 2,
         ["fig.provenance.json: not a provenance sidecar"]),
    Case("trail: no sidecar", [], ["trail", "{t}/fig.png"], 2, ["fig.provenance.json: no provenance sidecar"]),
    # configuration files
    Case("config: a misspelt key", [_write("c.yaml", "calibraton: {tau: 1}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["unknown key calibraton"]),
    Case("config: a value out of range", [_write("c.yaml", "calibration: {quantile: 2}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2,
         ["c.yaml: invalid configuration", "calibration.quantile: 2 is greater than or equal to the maximum of 1"]),
    Case("config: NaN in a setting", [_write("c.yaml", "calibration: {beta: .nan, mode: soft}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["calibration.beta: nan is not a finite number"]),
    Case("config: an infinite over-penalised lambda", [_write("c.yaml", "decode: {overpenalised_lambda: .inf}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["decode.overpenalised_lambda: inf is not a finite number"]),
    Case("config: a key given twice",
         [_write("c.yaml", "calibration:\n  tau: -4\nseed: 1\ncalibration:\n  tau: -0.5\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["the key 'calibration' is given twice", "lines 1 and 4"]),
    Case("config: an integer written as a float", [_write("c.yaml", "decode: {bon_n: 20.0}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["decode.bon_n: 20.0 is not an integer; write 20"]),
    Case("config: a float read as text by YAML", [_write("c.yaml", "train: {sft: {learning_rate: 2e-5}}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2,
         ["train.sft.learning_rate: '2e-5' is a string, not a number", "write 2.0e-5"]),
    Case("config: a literal lambda written as a number", [_write("c.yaml", "decode: {lambdas: [zero, star, 0.5]}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2,
         ["decode.lambdas.2: 0.5 is not of type 'string'", "0p5 for 0.5"]),
    Case("config: a seed too large", [_write("c.yaml", f"seed: {2**45}\n")], ["validate-config", CONFIG, "{t}/c.yaml"],
         2, ["seed: 35184372088832 is greater than the maximum of 2147483645"]),
    Case("config: a name ending in a newline", [_write("c.yaml", 'experiment: "tiny\\n"\ncalibration: {tau: -0.5}\n')],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["experiment: 'tiny\\n' is not a name of letters"]),
    Case("config: a password in the judge URL",
         [_write("c.yaml", "evaluation: {judge: {model: gpt-x, base_url: 'https://bob:hunter2@x.org/v1'}}\n")],
         ["validate-config", CONFIG, "{t}/c.yaml"], 2, ["evaluation.judge.base_url: the URL carries credentials"],
         hidden=["hunter2"]),
    Case("config: not YAML", [_write("c.yaml", "calibration: [unclosed\n")], ["validate-config", "{t}/c.yaml"], 2,
         ["c.yaml: not valid YAML"]),
    Case("config: no such file", [], ["validate-config", "{t}/c.yaml"], 2, ["c.yaml: config file not found"]),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fault(case, tmp_path):
    """Each case through the CLI's main function in this process (a few also run as real processes below)."""
    for make in case.make:
        make(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    rc, out, err = lara_in_process([a.replace("{t}", str(tmp_path)) for a in case.argv], env=case.env)
    _check(case, tmp_path, before, rc, err + out)


# the same cases in a real `python -m lara` process: the console entry point, its exit status and stderr
IN_A_PROCESS = ["calibrate: a NaN beta in --settings", "select-bon: a NaN over-penalised lambda",
                "config: a key given twice", "judge: a password in the endpoint URL", "trail: no sidecar",
                "train-sft: no such model", "calibrate: temporaries of a killed writer"]


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c in CASES if c.name in IN_A_PROCESS], ids=IN_A_PROCESS)
def test_fault_in_a_process(case, tmp_path):
    for make in case.make:
        make(tmp_path)
    before = {p.name for p in tmp_path.iterdir()}
    proc = lara(*[a.replace("{t}", str(tmp_path)) for a in case.argv], env=case.env)
    _check(case, tmp_path, before, proc.returncode, proc.stderr + proc.stdout)


def _check(case, tmp_path, before, rc, out):
    assert rc == case.rc, out[-3000:]
    for message in case.messages:
        assert message in out, f"{message!r} not in:\n{out[-3000:]}"
    for secret in case.hidden:
        assert secret not in out, f"{secret!r} was repeated:\n{out[-3000:]}"
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
    # a config file as text: YAML that a dict cannot hold
    ("a key given twice", "calibration:\n  tau: -4\ndecode: {bon_n: 4}\ncalibration:\n  tau: -0.5\n",
     ["the key 'calibration' is given twice in one mapping (lines 1 and 4)"]),
    ("NaN in a setting", "calibration: {beta: .nan, mode: soft}\n", ["calibration.beta: nan is not a finite number"]),
    ("a password in the judge URL", "evaluation: {judge: {model: gpt-x, base_url: 'https://bob:hunter2@x.org/v1'}}\n",
     ["evaluation.judge.base_url: the URL carries credentials (user:password@)"]),
]


@pytest.fixture(scope="module")
def dry_workflow(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("faults") / "wf")


@pytest.mark.parametrize("name, override, messages", WORKFLOW_CASES, ids=[c[0] for c in WORKFLOW_CASES])
def test_workflow_fault(dry_workflow, tmp_path, name, override, messages):
    (tmp_path / "c.yaml").write_text(override if isinstance(override, str) else yaml.safe_dump(override))
    proc = run_snakemake(dry_workflow, "-n", "--configfile", str(tmp_path / "c.yaml"), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    for message in messages:
        assert message in out, f"{message!r} not in:\n{out[-3000:]}"
    assert "hunter2" not in out  # a credential is never repeated (nor reaches a shell command: no job is made)
    assert not (dry_workflow / "results").exists() and not (dry_workflow / "logs").exists()


def test_costs_exactly_at_tau_are_feasible_despite_rounding(tmp_path):
    df = candidates()
    df["cost"] = -0.3  # every sample exactly at the budget: feasible at lambda = 0
    df.to_parquet(tmp_path / "cand.parquet")
    proc = lara("calibrate", "--scores", tmp_path / "cand.parquet", "--tau", -0.3, "--bootstrap", 200,
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
