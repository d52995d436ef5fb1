"""Inputs and outputs that cannot hurt: every `lara` step refuses, before it computes, an output that is one of
its inputs (however named: ./, ../, a symbolic or a hard link), lies inside an input folder or holds one, is
another output, is a folder where a file goes (or a file where a folder goes), a pipe, empty, `-`, or longer
than the file system allows; a write that fails (a full disk, a quota, a file size limit, a read-only or refused
folder) is one line and leaves the old output as it was; negative numbers are values; prompts that differ only
by invisible characters or compatibility forms are one prompt. Each case runs the real entry point
(conftest.lara_in_process; a few as real `python -m lara` processes, the full disk on a real, tiny file system)
and checks the exit status, the message (naming the flag and the path), that every file there before is
byte-identical afterwards and that no temporary file is left."""

import errno
import hashlib
import json
import os
import re
import resource
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from ..conftest import Case, lara_in_process


def candidates(n_prompts=25, n=4, seed=0):
    rng = np.random.default_rng(seed)
    return pd.DataFrame([{"prompt_id": f"p{i}", "sample_id": k, "prompt": f"q{i}", "response": f"a{i}{k}",
                          "reward": rng.normal(), "cost": rng.normal()} for i in range(n_prompts) for k in range(n)])


def _cand(t):
    candidates().to_parquet(t / "cand.parquet")


def _write(name, content=b"x"):
    def make(t):
        (t / name).parent.mkdir(parents=True, exist_ok=True)
        (t / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return make


def _mkdir(name):
    return lambda t: (t / name).mkdir(parents=True, exist_ok=True)


def _symlink(name, target):
    return lambda t: (t / name).symlink_to(target)


def _hardlink(name, target):
    return lambda t: os.link(t / target, t / name)


def _fifo(name):
    return lambda t: os.mkfifo(t / name)


def _scores(t):
    candidates(n=1).assign(method="bon", setting="zero", helpfulness=1.0, harmfulness=0.0,
                        **{"lambda": 0.0}).to_parquet(t / "s.parquet")


def _dataset_folder(t):
    (t / "data").mkdir()
    pd.DataFrame({"prompt": [f"question {i}" for i in range(20)]}).to_json(t / "data" / "pool.jsonl",
                                                                          orient="records", lines=True)


BREAD = "How do I bake bread?"
# one prompt written eleven ways (Unicode forms, invisible and compatibility characters, spaces), one that
# differs by case (another prompt), and five others: eight distinct prompts
VARIANTS = [BREAD, "How do\u200b I bake bread?", "How do I ba\u00adke bread?", "How do I\u2060 bake bread?",
            "\ufeffHow do I bake bread?", "How do I\u00a0bake bread?", "How do I bake bread?\u200e", BREAD + "   ",
            "How do I bake bread\uff1f", "How do I ba\u034fke bread?", "How do I\u3000bake bread?",
            "Caf\u00e9 au lait?", "Cafe\u0301 au lait?", "\uff23af\u00e9 au lait\ufe0f?", BREAD.upper()]
DISTINCT = 3 + 5


def _variant_pool(t):
    rows = [{"prompt": p} for p in VARIANTS + [f"question {i}" for i in range(5)]]
    (t / "pool.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _preferences_with_variants_of_the_pool(t):
    """A test pool of five prompts; preference prompts: the same five in full-width letters and with invisible
    characters, and three others (the only ones calibration may take)."""
    pool = [f"question {i}" for i in range(5)]
    (t / "pool.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in pool))
    wide = ["".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" for c in p) for p in pool]
    hidden = [p.replace(" ", " \u2060\u200b") + "\ufeff" for p in pool]
    pd.DataFrame({"prompt": wide + hidden + ["other 1", "other 2", "other 3"]}).to_parquet(t / "prefs.parquet")


def _pool_in_an_unnamed_index(t):
    pd.DataFrame({"n": range(20)}, index=[f"question {i}" for i in range(20)]).to_parquet(t / "pool.parquet")


def _pool_in_a_named_index(t):
    pd.DataFrame({"prompt": [f"question {i}" for i in range(20)], "n": range(20)}).set_index("prompt") \
        .to_parquet(t / "pool.parquet")


def _sft_with_an_index(t):
    pd.DataFrame({"instruction": ["a", "b", "c"], "input": ["", "", ""], "output": ["x", "y", "z"]},
                 index=[7, 3, 5]).to_parquet(t / "sft_in.parquet")


def _mixed_ids(t):
    df = candidates().astype({"prompt_id": object})
    df.loc[df["prompt_id"] == "p0", "prompt_id"] = 1
    df.loc[df["prompt_id"] == "p1", "prompt_id"] = "1"
    df.to_json(t / "cand.jsonl", orient="records", lines=True)


def _spelt_ids(t):
    df = candidates()
    df["prompt_id"] = df["prompt_id"].replace({"p0": "01", "p1": "1"})
    df.to_csv(t / "cand.csv", index=False)


def _ids_in_the_index(t):
    candidates().set_index(["prompt_id", "sample_id"]).to_parquet(t / "cand.parquet")


def _toy_inputs_in(folder):
    def make(t):
        from lara.toy.world import ToyWorldSettings, generate

        world = generate(ToyWorldSettings(seed=5, n_sft=30, n_pairs=40, n_eval_prompts=10))
        (t / folder).mkdir(parents=True, exist_ok=True)
        for name, rows in (("alpaca.jsonl", world["alpaca"]), ("pairs.jsonl", world["safe_rlhf"])):
            (t / folder / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return [make]


def _tau(value):
    def check(t):
        assert json.loads((t / "lambda.json").read_text())["tau"] == value
    return check


def _split_sizes(n_cal, n_test):
    def check(t):
        from lara.data.splits import prompt_key

        cal, test = pd.read_parquet(t / "cal.parquet"), pd.read_parquet(t / "test.parquet")
        assert len(cal) == n_cal and len(test) == n_test
        keys = [prompt_key(p) for p in [*cal["prompt"], *test["prompt"]]]
        assert len(set(keys)) == n_cal + n_test  # each prompt once, in one split only
    return check


def _calibration_is(prompts):
    def check(t):
        assert sorted(pd.read_parquet(t / "cal.parquet")["prompt"]) == sorted(prompts)
    return check


def _sft_rows(t):
    out = pd.read_parquet(t / "sft.parquet")
    assert list(out.columns) == ["instruction", "input", "output", "prompt"]
    assert list(out["output"]) == ["x", "y", "z"]




CAL = ["calibrate", "--scores", "{t}/cand.parquet", "--tau", "0", "--bootstrap", "200", "--out"]
SEL = ["select-bon", "--candidates", "{t}/cand.parquet", "--setting", "zero", "--overpenalised-lambda", "5", "--out"]
AGG = ["aggregate", "--scores", "{t}/s.parquet", "--tau", "0"]
SPLIT = ["split-prompts", "--n-calibration", "5", "--n-test", "5"]
FOLDER_SPLIT = [*SPLIT, "--split", "train", "--source", "{t}/data"]  # from a local dataset folder (its one split)
TRAIN = ["train-sft", "--model", "{t}/m", "--data", "{t}/cand.parquet", "--checkpoints", "{t}/ck", "--out"]
TOY = ["make-toy-model", "--alpaca", "{t}/d/alpaca.jsonl", "--preferences", "{t}/d/pairs.jsonl", "--vocab-size", "300",
       "--hidden-size", "16", "--intermediate-size", "32", "--num-hidden-layers", "1", "--num-attention-heads", "2",
       "--num-key-value-heads", "1", "--out"]
CONFIG = str(Path(__file__).resolve().parents[2] / "config" / "config.yaml")
MODEL = [_cand, _write("m/config.json", "{}")]
NAME_MAX = os.pathconf("/tmp", "PC_NAME_MAX")
LONG_DIR = "/".join(["d" * 250] * 20)
NOTHING = "(nothing was computed; the input is left as it was)"

CASES = [
    # 1. an output that is an input, however it is named
    Case("select-bon: --out is the --candidates file", [_cand], [*SEL, "{t}/cand.parquet"], 2,
         [f"--out {{t}}/cand.parquet: is also the input --candidates {NOTHING}"]),
    Case("aggregate: --out is the --scores file", [_scores], [*AGG, "--out", "{t}/s.parquet", "--audit", "{t}/a.json"],
         2, [f"--out {{t}}/s.parquet: is also the input --scores {NOTHING}"]),
    Case("calibrate: --out is --scores through ./ and ../", [_cand, _mkdir("sub")],
         ["calibrate", "--scores", "./sub/../cand.parquet", "--tau", "0", "--out", "cand.parquet"], 2,
         [f"--out cand.parquet: is also the input --scores {NOTHING}"], cwd=True),
    Case("select-bon: --out a symbolic link to the input", [_cand, _symlink("link.parquet", "cand.parquet")],
         [*SEL, "{t}/link.parquet"], 2, [f"--out {{t}}/link.parquet: is also the input --candidates {NOTHING}"]),
    Case("select-bon: --out a hard link of the input", [_cand, _hardlink("hard.parquet", "cand.parquet")],
         [*SEL, "{t}/hard.parquet"], 2, [f"--out {{t}}/hard.parquet: is also the input --candidates {NOTHING}"]),
    Case("judge: --cache is the --responses file", [_cand],
         ["judge", "--responses", "{t}/cand.parquet", "--cache", "{t}/cand.parquet", "--out", "{t}/j.parquet"], 2,
         [f"--cache {{t}}/cand.parquet: is also the input --responses {NOTHING}"]),
    Case("validate-config: --out is a config file it reads", [_write("c.yaml", "seed: 1\n")],
         ["validate-config", CONFIG, "{t}/c.yaml", "--out", "{t}/c.yaml"], 2,
         [f"--out {{t}}/c.yaml: is also the input configs {NOTHING}"]),
    Case("train-sft: --out is the --model folder", MODEL, [*TRAIN, "{t}/m"], 2,
         [f"--out {{t}}/m: is also the input --model {NOTHING}"]),
    # ... a file inside an input folder, an input inside an output folder
    Case("split-prompts: --test is a file of the --source folder", [_dataset_folder],
         [*FOLDER_SPLIT, "--calibration", "{t}/cal.parquet", "--test", "{t}/data/pool.jsonl"], 2,
         ["--test {t}/data/pool.jsonl: is inside the input folder --source {t}/data; writing it would change that "
          "input (nothing was computed)"]),
    Case("split-prompts: --calibration a new file in the --source folder", [_dataset_folder],
         [*FOLDER_SPLIT, "--calibration", "{t}/data/cal.parquet", "--test", "{t}/test.parquet"], 2,
         ["--calibration {t}/data/cal.parquet: is inside the input folder --source {t}/data"]),
    Case("train-sft: --out a folder inside --model", MODEL, [*TRAIN, "{t}/m/sft"], 2,
         ["--out {t}/m/sft: is inside the input folder --model {t}/m"]),
    Case("make-toy-model: --out the folder that holds --alpaca", _toy_inputs_in("d"), [*TOY, "{t}/d"], 2,
         ["--out {t}/d: holds the input --alpaca {t}/d/alpaca.jsonl, and this step replaces that folder "
          f"{NOTHING}"]),
    # ... two outputs that are one
    Case("aggregate: --out and --audit the same file", [_scores], [*AGG, "--out", "{t}/s.csv", "--audit", "{t}/s.csv"],
         2, ["--audit {t}/s.csv: is also the output --out; one file cannot hold both (nothing was computed)"]),
    Case("split-prompts: --calibration and --test one file through a link", [_dataset_folder, _mkdir("out"),
                                                                            _symlink("same", "out")],
         [*FOLDER_SPLIT, "--calibration", "{t}/out/x.parquet", "--test", "{t}/same/x.parquet"], 2,
         ["--test {t}/same/x.parquet: is also the output --calibration"]),
    Case("train-sft: --checkpoints inside --out", MODEL,
         ["train-sft", "--model", "{t}/m", "--data", "{t}/cand.parquet", "--checkpoints", "{t}/new/ck", "--out",
          "{t}/new"], 2, ["--checkpoints {t}/new/ck: is inside the output folder --out {t}/new"]),
    # 2. a folder where a file goes, and a file where a folder goes
    Case("calibrate: --out a folder without a suffix", [_cand, _mkdir("lambda")], [*CAL, "{t}/lambda"], 2,
         ["--out {t}/lambda: is a folder; this step writes a file there (nothing was computed)"]),
    Case("select-bon: --out a link to a folder", [_cand, _mkdir("dir"), _symlink("res", "dir")], [*SEL, "{t}/res"],
         2, ["--out {t}/res: is a folder; this step writes a file there"]),
    Case("calibrate: --out ends in a slash", [_cand], [*CAL, "{t}/new.json/"], 2,
         ["--out {t}/new.json/: names a folder (it ends in '/' or '.'); this step writes a file there: give the "
          "file's name (nothing was computed)"]),
    Case("train-sft: --out an existing file", [*MODEL, _write("model.bin", b"weights")], [*TRAIN, "{t}/model.bin"],
         2, ["--out {t}/model.bin: is a file; this step writes a folder there (nothing was computed; the file is "
             "left as it was)"]),
    Case("make-toy-model: --out an existing file", [*_toy_inputs_in("d"), _write("model", b"old")], [*TOY, "{t}/model"],
         2, ["--out {t}/model: is a file; this step writes a folder there"]),
    Case("calibrate: --out a named pipe", [_cand, _fifo("pipe")], [*CAL, "{t}/pipe"], 2,
         ["--out {t}/pipe: is a named pipe (FIFO), not a regular file; this step writes a file there and would "
          "replace it (nothing was computed)"]),
    Case("calibrate: --out ''", [_cand], [*CAL, ""], 2,
         ["--out '': an empty path; name a file (nothing was computed)"]),
    Case("calibrate: --out -", [_cand], [*CAL, "-"], 2,
         ["--out -: this step cannot write to standard output; name a file (nothing was computed)"]),
    Case("calibrate: --out under a file", [_cand], [*CAL, "{t}/cand.parquet/lambda.json"], 2,
         ["--out {t}/cand.parquet/lambda.json: {t}/cand.parquet is a file, not a folder (nothing was computed)"]),
    Case("calibrate: --out through a symbolic link loop", [_cand, _symlink("loop", "loop")],
         [*CAL, "{t}/loop/lambda.json"], 2,
         ["--out {t}/loop/lambda.json: {t}/loop is a symbolic link loop, not a folder (nothing was computed)"]),
    Case("calibrate: --out a symbolic link loop", [_cand, _symlink("a.json", "b.json"), _symlink("b.json", "a.json")],
         [*CAL, "{t}/a.json"], 2, ["--out {t}/a.json: is a symbolic link loop (nothing was computed)"]),
    Case("calibrate: --out through a link to nothing", [_cand, _symlink("gone", "nowhere")],
         [*CAL, "{t}/gone/lambda.json"], 2,
         ["--out {t}/gone/lambda.json: {t}/gone is a symbolic link to nothing (nowhere), not a folder"]),
    Case("calibrate: --out in /proc", [_cand], [*CAL, "/proc/lambda.json"], 2,
         ["--out /proc/lambda.json: cannot write in /proc", "nothing was computed"]),
    # 3. names the file system cannot hold
    Case("calibrate: an output name that fits, but not with the temporary's 14 bytes", [_cand],
         [*CAL, "{t}/" + "x" * (NAME_MAX - 5) + ".json"], 2,
         [f"its name is {NAME_MAX} bytes, more than the {NAME_MAX - 14} this file system allows ({NAME_MAX}, less 14 "
          "for the temporary name beside it); shorten it (nothing was computed)"]),
    Case("calibrate: an output name of 300 bytes", [_cand], [*CAL, "{t}/" + "x" * 295 + ".json"], 2,
         ["--out /", "xxx.json: its name is 300 bytes"]),
    Case("calibrate: a folder name of 300 bytes", [_cand], [*CAL, "{t}/" + "d" * 300 + "/lambda.json"], 2,
         ["the folder name ddd", f"is 300 bytes, more than the {NAME_MAX} this file system allows"]),
    Case("calibrate: a path longer than PATH_MAX", [_cand], [*CAL, f"{{t}}/{LONG_DIR}/lambda.json"], 2,
         ["--out /", "ddd/lambda.json: the full path is", "more than the 4095 this system allows (PATH_MAX)"]),
    Case("calibrate: a name short in characters but not in bytes", [_cand],
         [*CAL, "{t}/" + "\u00e9" * ((NAME_MAX - 5) // 2) + ".json"], 2,
         [f"its name is {(NAME_MAX - 5) // 2 * 2 + 5} bytes, more than the {NAME_MAX - 14}"]),
    Case("calibrate: a unicode name within the limit", [_cand], [*CAL, "{t}/\u00e9t\u00e9-\u03bb-\u2603.json"], 0, [],
         new=["\u00e9t\u00e9-\u03bb-\u2603.json"]),
    # 5. negative numbers are values
    Case("calibrate: --tau -1e-3", [_cand], [*CAL, "{t}/lambda.json", "--tau", "-1e-3"], 0, [], check=_tau(-0.001),
         new=["lambda.json"]),
    Case("calibrate: --tau -.5", [_cand], [*CAL, "{t}/lambda.json", "--tau", "-.5"], 0, [], check=_tau(-0.5),
         new=["lambda.json"]),
    Case("calibrate: --tau -1E3", [_cand], [*CAL, "{t}/lambda.json", "--tau", "-1E3"], 2,
         ["tau=-1000.0 is not reachable"]),
    Case("calibrate: --tau -inf", [_cand], [*CAL, "{t}/lambda.json", "--tau", "-inf"], 2,
         ["calibration.tau: -inf is not a finite number"]),
    Case("calibrate: --tau -x is still no value", [_cand], [*CAL, "{t}/lambda.json", "--tau", "-x"], 2,
         ["argument --tau: expected one argument"]),
    Case("select-bon: --overpenalised-lambda -1e-3", [_cand],
         ["select-bon", "--candidates", "{t}/cand.parquet", "--setting", "max", "--overpenalised-lambda", "-1e-3",
          "--out", "{t}/o.parquet"], 2, ["decode.overpenalised_lambda: -0.001 is less than the minimum of 0"]),
    Case("train-sft: --learning-rate -2e-5", MODEL, [*TRAIN, "{t}/sft", "--learning-rate", "-2e-5"], 2,
         ["train.sft.learning_rate: -2e-05 is less than or equal to the minimum of 0"]),
    Case("rgtg: --temperature -.5", [lambda t: pd.DataFrame({"prompt_id": ["p0"], "prompt": ["hi"]})
                                      .to_parquet(t / "prompts.parquet")],
         ["rgtg", "--method", "args", "--policy", "{t}/none", "--reward", "{t}/none", "--cost", "{t}/none",
          "--prompts", "{t}/prompts.parquet", "--setting", "zero", "--overpenalised-lambda", "5",
          "--temperature", "-.5", "--out", "{t}/o.parquet"], 2,
         ["decode.rgtg.args.temperature: -0.5 is less than the minimum of 0"]),
    # 6. prompts, ids and indexes in the data steps
    Case("split-prompts: invisible and compatibility variants are one prompt", [_variant_pool],
         ["split-prompts", "--source", "{t}/pool.jsonl", "--n-calibration", "4", "--n-test", str(DISTINCT - 4),
          "--calibration", "{t}/cal.parquet", "--test", "{t}/test.parquet"], 0, [],
         check=_split_sizes(4, DISTINCT - 4), new=["cal.parquet", "test.parquet"]),
    Case("split-prompts: no more prompts than the distinct ones", [_variant_pool],
         ["split-prompts", "--source", "{t}/pool.jsonl", "--n-calibration", "4", "--n-test", str(DISTINCT - 3),
          "--calibration", "{t}/cal.parquet", "--test", "{t}/test.parquet"], 2,
         [f"pool.jsonl: {DISTINCT} distinct prompts, but n_calibration + n_test = 4 + {DISTINCT - 3} = {DISTINCT + 1} "
          "are needed"]),
    Case("split-prompts: calibration never takes a variant of a test prompt", [_preferences_with_variants_of_the_pool],
         ["split-prompts", "--source", "{t}/pool.jsonl", "--n-calibration", "3", "--n-test", "5",
          "--calibration-preferences", "{t}/prefs.parquet", "--calibration", "{t}/cal.parquet", "--test",
          "{t}/test.parquet"], 0, [], check=_calibration_is(["other 1", "other 2", "other 3"]),
         new=["cal.parquet", "test.parquet"]),
    Case("split-prompts: the prompts in an unnamed stored pandas index", [_pool_in_an_unnamed_index],
         [*SPLIT, "--source", "{t}/pool.parquet", "--calibration", "{t}/cal.parquet", "--test", "{t}/test.parquet"],
         2, ["pool.parquet: missing column(s) prompt (found: n, __index_level_0__); __index_level_0__ is a pandas "
             "index stored without a name"]),
    Case("split-prompts: the prompts in a named stored pandas index", [_pool_in_a_named_index],
         [*SPLIT, "--source", "{t}/pool.parquet", "--calibration", "{t}/cal.parquet", "--test", "{t}/test.parquet"],
         0, [], check=_split_sizes(5, 5), new=["cal.parquet", "test.parquet"]),
    Case("calibrate: prompt ids 1 and '1' in one column", [_mixed_ids],
         ["calibrate", "--scores", "{t}/cand.jsonl", "--tau", "0", "--out", "{t}/lambda.json"], 2,
         ["cand.jsonl: column 'prompt_id' holds the ids 1 and '1' (int and str), which are one id once the table is "
          "written and read again"]),
    Case("calibrate: prompt ids '01' and '1'", [_spelt_ids],
         ["calibrate", "--scores", "{t}/cand.csv", "--tau", "0", "--out", "{t}/lambda.json"], 2,
         ["cand.csv: column 'prompt_id' holds the ids '01' and '1', which are one id"]),
    Case("calibrate: scores stored with (prompt_id, sample_id) as their pandas index", [_ids_in_the_index],
         [*CAL, "{t}/lambda.json"], 0, [], new=["lambda.json"]),
    Case("prepare-data: a parquet with a stored index", [_sft_with_an_index],
         ["prepare-data", "--kind", "sft", "--source", "{t}/sft_in.parquet", "--out", "{t}/sft.parquet"], 0, [],
         check=_sft_rows, new=["sft.parquet"]),
]


def _files(root: Path) -> dict[str, str]:
    """Every file under ``root`` (not following links): a regular file's sha256, a link's target, a folder."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = p.lstat().st_mode
            found[str(p.relative_to(root))] = (os.readlink(p) if stat.S_ISLNK(mode) else
                                               hashlib.sha256(p.read_bytes()).hexdigest() if stat.S_ISREG(mode)
                                               else "folder" if stat.S_ISDIR(mode) else stat.S_IFMT(mode))
    return found


def _temporaries(root: Path) -> list[str]:
    return [str(p) for p in root.rglob(".*") if p.name.endswith(".tmp") or p.name.startswith(".lara-write-check-")]


def _check(case: Case, t: Path, before: dict, rc: int, out: str) -> None:
    assert rc == case.rc, out[-3000:]
    for message in case.messages:
        message = message.replace("{t}", str(t))
        assert message in out, f"{message!r} not in:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    after = _files(t)
    assert {k: v for k, v in after.items() if k in before} == before, "a file that was there has changed"
    assert sorted(set(after) - set(before)) == sorted(case.new), "files were left behind"
    assert not _temporaries(t)
    if case.rc == 0 and case.check is not None:
        case.check(t)


def _argv(case, t):
    return [a.replace("{t}", str(t)) for a in case.argv]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_io_fault(case, tmp_path):
    for make in case.make:
        make(tmp_path)
    before = _files(tmp_path)
    rc, out, err = lara_in_process(_argv(case, tmp_path), cwd=tmp_path if case.cwd else None)
    _check(case, tmp_path, before, rc, err + out)


IN_A_PROCESS = ["select-bon: --out is the --candidates file", "calibrate: --tau -1e-3",
                "calibrate: a name short in characters but not in bytes",
                "split-prompts: invisible and compatibility variants are one prompt"]


def lara(*args, **kwargs):
    return subprocess.run([sys.executable, "-m", "lara", *map(str, args)], capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize("case", [c for c in CASES if c.name in IN_A_PROCESS], ids=IN_A_PROCESS)
def test_io_fault_in_a_process(case, tmp_path):
    for make in case.make:
        make(tmp_path)
    before = _files(tmp_path)
    proc = lara(*_argv(case, tmp_path), cwd=tmp_path if case.cwd else None)
    _check(case, tmp_path, before, proc.returncode, proc.stderr + proc.stdout)


# ---------------------------------------------------------------------------------------------
# 4. a write that fails: the step says so in one line, the temporary is removed, the old output kept

OLD = b'{"old": "lambda.json, before this run"}\n'


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES])
@pytest.mark.parametrize("old", [True, False], ids=["an old output", "no old output"])
def test_a_failed_json_write_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch, code, old):
    """The error the system gives while the record is written (open/write of the temporary file)."""
    _cand(tmp_path)
    if old:
        (tmp_path / "lambda.json").write_bytes(OLD)
    before = _files(tmp_path)
    real = Path.write_text

    def write_text(self, *args, **kwargs):
        if self.name.startswith(".lambda.json."):
            real(self, "{\"half\": ")  # part of it written, then the disk refuses
            raise OSError(code, os.strerror(code), str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    rc, out, err = lara_in_process(_argv(Case("", [], [*CAL, "{t}/lambda.json"], 2, []), tmp_path))
    words = os.strerror(code)
    kept = "the old file is left as it was" if old else "nothing was left there"
    assert rc == 2, err
    assert f"--out {tmp_path}/lambda.json: {words[0].lower()}{words[1:]} while writing; {kept}" in err, err
    assert "Traceback" not in err and _files(tmp_path) == before and not _temporaries(tmp_path)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_a_failed_parquet_write_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch, code):
    """pyarrow's own error (an OSError with the errno and no file name)."""
    import pyarrow.parquet as pq

    _cand(tmp_path)
    (tmp_path / "out.parquet").write_bytes(b"old table")
    before = _files(tmp_path)

    def write_table(table, where, *args, **kwargs):
        Path(where).write_bytes(b"PAR1 half")
        raise OSError(code, f"Error writing bytes to file. Detail: [errno {code}] {os.strerror(code)}")

    monkeypatch.setattr(pq, "write_table", write_table)
    rc, out, err = lara_in_process(_argv(Case("", [], [*SEL, "{t}/out.parquet"], 2, []), tmp_path))
    assert rc == 2, err
    words = os.strerror(code)
    assert (f"--out {tmp_path}/out.parquet: {words[0].lower()}{words[1:]} while writing; the old file is left as it "
            "was") in err, err
    assert "Traceback" not in err and _files(tmp_path) == before and not _temporaries(tmp_path)


def test_no_room_for_the_temporary_file_itself(tmp_path, monkeypatch):
    """The quota runs out as the temporary file is made (no inode left): the same one line."""
    import tempfile

    _cand(tmp_path)
    (tmp_path / "lambda.json").write_bytes(OLD)
    before = _files(tmp_path)

    def mkstemp(*args, **kwargs):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), str(tmp_path / ".lambda.json.x.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)
    rc, out, err = lara_in_process(_argv(Case("", [], [*CAL, "{t}/lambda.json"], 2, []), tmp_path))
    assert rc == 2 and "disk quota exceeded while writing; the old file is left as it was" in err, err
    assert "Traceback" not in err and _files(tmp_path) == before


def test_an_input_that_cannot_be_read_is_not_called_a_failed_write(tmp_path):
    """Inside a write, a refused *input* (its own file name) is not the output's fault: it goes through as it is."""
    from lara.io import WriteError, atomic_output

    with pytest.raises(PermissionError) as raised, atomic_output(tmp_path / "x.json") as tmp:
        tmp.write_text("half")
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "input.parquet"))
    assert not isinstance(raised.value, WriteError) and os.listdir(tmp_path) == []
    with pytest.raises(WriteError, match="x.json: no space left on device while writing; nothing was left there"), \
            atomic_output(tmp_path / "x.json") as tmp:
        raise OSError(errno.ENOSPC, "No space left on device")  # no file name: the write's
    assert os.listdir(tmp_path) == []


def test_a_folder_output_that_cannot_be_put_in_place_keeps_the_old_folder(tmp_path, monkeypatch):
    """The old model folder is moved aside, never deleted, until the new one is in place."""
    from lara import io

    out = tmp_path / "model"
    out.mkdir()
    (out / "weights").write_bytes(b"old weights")
    real = os.replace

    def replace(src, dst):
        if Path(dst) == out:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real(src, dst)

    monkeypatch.setattr(io.os, "replace", replace)
    with pytest.raises(io.WriteError, match="model: read-only file system while writing; the old folder is left"), \
            io.atomic_output(out, directory=True) as tmp:
        (tmp / "weights").write_bytes(b"new weights")
    assert (out / "weights").read_bytes() == b"old weights" and sorted(os.listdir(tmp_path)) == ["model"]
    monkeypatch.undo()
    with io.atomic_output(out, directory=True) as tmp:
        (tmp / "weights").write_bytes(b"new weights")
    assert (out / "weights").read_bytes() == b"new weights" and sorted(os.listdir(tmp_path)) == ["model"]


def test_a_record_written_into_a_temporary_keeps_the_longest_name_the_check_allows(tmp_path):
    """write_json(tmp) inside atomic_output(out) writes tmp in place: one temporary name, never two nested ones
    (whose 28 bytes would fail a name that the output check let through)."""
    from lara.io import atomic_output, write_json

    out = tmp_path / ("x" * (NAME_MAX - 14 - 5) + ".json")
    with atomic_output(out) as tmp:
        write_json(tmp, {"a": 1})
    assert json.loads(out.read_text()) == {"a": 1} and os.listdir(tmp_path) == [out.name]


def _fsize_limit(limit):
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write beyond the limit fails with EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limited


@pytest.mark.parametrize("argv, out", [(CAL, "lambda.json"), (SEL, "out.parquet")], ids=["json", "parquet"])
def test_a_file_size_limit_in_a_real_process(tmp_path, argv, out):
    """A real `python -m lara` under a file size limit (ulimit -f; RLIMIT_FSIZE): the write of the output fails
    with EFBIG, the step with one line and exit status 2, the old output as it was."""
    _cand(tmp_path)
    (tmp_path / out).write_bytes(b"old")
    before = _files(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "lara", *_argv(Case("", [], [*argv, f"{{t}}/{out}"], 2, []),
                                                                 tmp_path)],
                          capture_output=True, text=True, preexec_fn=_fsize_limit(600))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"--out {tmp_path}/{out}: file too large while writing; the old file is left as it was" in proc.stderr
    assert "Traceback" not in proc.stderr and _files(tmp_path) == before and not _temporaries(tmp_path)


# a real, tiny file system (tmpfs) in a user and mount namespace of the test's own: no root, nothing mounted
# outside the test's process, gone with it
SMALL_FS = textwrap.dedent("""
    set -e
    mount -t tmpfs -o "$MOUNT_OPTIONS" lara-test "$SMALL"
    "$@"
""")


def _small_fs(tmp_path, options, script) -> dict:
    if not shutil.which("unshare"):
        pytest.skip("no unshare")
    small = tmp_path / "small"
    small.mkdir()
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k x {small}"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces to mount a tiny file system in: {probe.stderr.strip()}")
    (tmp_path / "inside.py").write_text(script)
    env = os.environ | {"SMALL": str(small), "MOUNT_OPTIONS": options}
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", SMALL_FS, "sh", sys.executable, str(tmp_path / "inside.py"),
                           str(tmp_path), str(small)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


INSIDE = textwrap.dedent("""
    import hashlib, json, os, subprocess, sys
    t, small = sys.argv[1], sys.argv[2]
    runs = {}
    for name, argv in %s:
        old = os.path.join(small, name)
        if os.access(small, os.W_OK) and %s:
            with open(old, "wb") as fh:
                fh.write(b"old " + name.encode())
    if %s:  # fill the file system up: nothing more fits
        try:
            with open(os.path.join(small, "filler"), "wb") as fh:
                while True:
                    fh.write(b"0" * 4096)
                    fh.flush()
        except OSError:
            pass
    for name, argv in %s:
        before = {n: open(os.path.join(small, n), "rb").read().decode() for n in sorted(os.listdir(small))
                  if n != "filler"}
        proc = subprocess.run([sys.executable, "-m", "lara", *argv, os.path.join(small, name)], capture_output=True,
                              text=True)
        after = {n: open(os.path.join(small, n), "rb").read().decode() for n in sorted(os.listdir(small))
                 if n != "filler"}
        runs[name] = {"rc": proc.returncode, "stderr": proc.stderr[-3000:], "before": before, "after": after}
    print(json.dumps(runs))
""")


def test_a_full_disk_in_a_real_process(tmp_path):
    """ENOSPC for real: a 256 KiB tmpfs filled up, `lara calibrate` and `lara select-bon` writing there."""
    _cand(tmp_path)
    runs = [("lambda.json", _argv(Case("", [], CAL, 2, []), tmp_path)),
            ("out.parquet", _argv(Case("", [], SEL, 2, []), tmp_path))]
    result = _small_fs(tmp_path, "size=256k", INSIDE % (runs, True, True, runs))
    small = tmp_path / "small"
    for name, _ in runs:
        r = result[name]
        assert r["rc"] == 2, r["stderr"]
        assert f"--out {small}/{name}: no space left on device while writing; the old file is left as it was" in \
            r["stderr"], r["stderr"]
        assert "Traceback" not in r["stderr"]
        assert r["after"] == r["before"] and r["after"][name] == f"old {name}"  # the old output whole, no temporary


def test_a_read_only_file_system_in_a_real_process(tmp_path):
    """A folder on a read-only file system (as root too, which no chmod stops): refused before computing."""
    _cand(tmp_path)
    runs = [("lambda.json", _argv(Case("", [], CAL, 2, []), tmp_path))]
    result = _small_fs(tmp_path, "ro,size=64k", INSIDE % (runs, False, False, runs))
    r = result["lambda.json"]
    assert r["rc"] == 2, r["stderr"]
    assert f"--out {tmp_path}/small/lambda.json: cannot write in {tmp_path}/small (Read-only file system); nothing " \
           "was computed" in r["stderr"], r["stderr"]
    assert r["after"] == r["before"] == {}


# ---------------------------------------------------------------------------------------------
# ids and indexes, for the table reader (lara.data.ids)


@pytest.mark.parametrize("ids, shown", [([1, "1", "p2"], "1 and '1' (int and str)"), (["01", "1"], "'01' and '1'"),
                                        (["p1", "p1 "], "'p1' and 'p1 '"), ([1.0, "1"], "1.0 and '1' (float and str)")])
def test_ids_that_collapse_once_read_again_are_refused(ids, shown):
    from lara.data.ids import check_id_types
    from lara.read.files import DataError

    with pytest.raises(DataError, match="^" + re.escape(f"x.jsonl: column 'prompt_id' holds the ids {shown}, ")):
        check_id_types(pd.DataFrame({"prompt_id": pd.Series(ids, dtype=object)}), "x.jsonl")


def test_distinct_ids_pass():
    from lara.data.ids import check_id_types

    check_id_types(pd.DataFrame({"prompt_id": ["p1", "P1", "1.5", "1", "-1", "10"], "sample_id": [0, 1, 2, 3, 4, 5]}),
                   "x.parquet")
    check_id_types(pd.DataFrame({"prompt_id": [1, 2, 3]}), "x.parquet")


def test_a_stored_pandas_index_is_undone(tmp_path):
    from lara.data.ids import plain_index
    from lara.read.files import DataError

    df = candidates(3, 2)
    df.set_index("prompt_id").to_parquet(tmp_path / "named.parquet")
    back = plain_index(pd.read_parquet(tmp_path / "named.parquet"), "named.parquet")
    assert list(back.columns) == list(df.columns) and back.equals(df)
    df.set_index(["prompt_id", "sample_id"]).to_parquet(tmp_path / "multi.parquet")
    assert plain_index(pd.read_parquet(tmp_path / "multi.parquet"), "multi.parquet").equals(df)
    df.iloc[2:].to_parquet(tmp_path / "sliced.parquet")  # a RangeIndex from 2
    assert list(plain_index(pd.read_parquet(tmp_path / "sliced.parquet"), "x").index) == [0, 1, 2, 3]
    df.set_axis([f"r{i}" for i in range(len(df))]).to_parquet(tmp_path / "labels.parquet")
    assert plain_index(pd.read_parquet(tmp_path / "labels.parquet"), "x").equals(df)
    clash = df.set_index(df["prompt_id"].rename("prompt_id"))
    with pytest.raises(DataError, match="the stored pandas index 'prompt_id' has the name of a column too"):
        plain_index(clash, "clash.parquet")
