"""One reader and one contract table (lara.read): no module reads an input file another way, every command has its
row, every row's flags are the command's own, and what the reader promises holds on real files."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import lara
from lara.data.errors import DataError
from lara.read import files
from lara.read.contracts import CONTRACTS, FOLDER, SOURCE, agree, check, table_markdown
from lara.read.expect import JSON, TABLE, Expect, read, strict_bool
from lara.steps import COMMANDS

PACKAGE = Path(lara.__file__).parent
READER = PACKAGE / "read"
TABLE_READS = {"read_parquet", "read_csv", "read_json", "read_table", "read_feather", "read_pickle", "read_excel"}


def _raw_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Calls that read a file's content without the reader: pd.read_*, json.load(fh), json.loads(X.read_text()),
    yaml.safe_load / yaml.load."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else None
        name = node.func.attr
        if owner in ("pd", "pandas") and name in TABLE_READS:
            found.append((node.lineno, f"{owner}.{name}"))
        elif owner == "json" and name == "load":
            found.append((node.lineno, "json.load"))
        elif owner == "json" and name == "loads" and node.args and isinstance(node.args[0], ast.Call) \
                and isinstance(node.args[0].func, ast.Attribute) and node.args[0].func.attr in ("read_text",
                                                                                               "read_bytes", "read"):
            found.append((node.lineno, "json.loads(<file>.read_text())"))
        elif owner == "yaml" and name in ("safe_load", "load", "full_load", "unsafe_load"):
            found.append((node.lineno, f"yaml.{name}"))
    return found


def test_no_module_reads_an_input_outside_the_reader():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if READER in path.parents:
            continue
        for line, what in _raw_reads(ast.parse(path.read_text())):
            offenders.append(f"{path.relative_to(PACKAGE)}:{line}: {what}")
    assert not offenders, "read through lara.read instead:\n" + "\n".join(offenders)


def test_the_scan_finds_each_kind_of_raw_read():
    code = ("import json, yaml, pandas as pd\npd.read_parquet('x')\njson.load(open('x'))\n"
            "json.loads(p.read_text())\nyaml.safe_load(s)\njson.loads(argument)\n")
    assert [w for _, w in _raw_reads(ast.parse(code))] == ["pd.read_parquet", "json.load",
                                                         "json.loads(<file>.read_text())", "yaml.safe_load"]


def test_every_command_has_one_row_and_every_row_a_command():
    assert set(CONTRACTS) == set(COMMANDS)


def _parser(command: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    importlib.import_module(COMMANDS[command]).add_arguments(parser)
    return parser


@pytest.mark.parametrize("command", sorted(CONTRACTS))
def test_each_rows_flags_are_the_commands_own(command):
    parser = _parser(command)
    dests = {a.dest for a in parser._actions}
    for flag, expect in CONTRACTS[command].inputs.items():
        assert flag.lstrip("-").replace("-", "_") in dests, f"{command}: {flag} is not one of its flags"
        many = next(a for a in parser._actions if a.dest == flag.lstrip("-").replace("-", "_")).nargs in ("+", "*")
        assert expect.many == many, f"{command} {flag}: many={expect.many}, but the flag takes " \
                                    f"{'several files' if many else 'one file'}"
        assert expect.fmt in (TABLE, JSON, FOLDER, SOURCE, "config")


def test_the_table_is_printed_in_the_architecture_doc():
    doc = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    assert table_markdown() in doc, "docs/architecture.md: paste `python -m lara.read.contracts`"


# ---------------------------------------------------------------------------------------------- the reader itself

def _scores(n=12, k=3, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"prompt_id": np.repeat([f"p{i}" for i in range(n)], k), "sample_id": np.tile(range(k), n),
                         "prompt": np.repeat([f"question {i}" for i in range(n)], k),
                         "response": [f"answer {i}" for i in range(n * k)],
                         "reward": rng.normal(size=n * k), "cost": rng.normal(size=n * k)})


SCORES = Expect("scores", kinds=("scores",), roles=("calibration",), columns=("prompt_id", "reward", "cost"),
                numbers=("reward", "cost"), unit="response")


def test_ids_are_text_in_every_format(tmp_path):
    df = _scores()
    df["prompt_id"] = np.repeat(np.arange(12), 3)
    for suffix in ("parquet", "csv", "jsonl"):
        path = tmp_path / f"s.{suffix}"
        files.write_table(df, path) if suffix != "csv" else df.to_csv(path, index=False)
        got = read(path, "--scores", SCORES).df
        assert got["prompt_id"].map(type).eq(str).all() and got["prompt_id"].iloc[-1] == "11"
    spelt = df.assign(prompt_id=df["prompt_id"].map(lambda i: f"0{i}" if i == 3 else str(i)))
    spelt.loc[0, "prompt_id"] = "3"
    spelt.to_csv(tmp_path / "spelt.csv", index=False)
    with pytest.raises(DataError, match="holds the ids '03' and '3'|holds the ids '3' and '03'"):
        read(tmp_path / "spelt.csv", "--scores", SCORES)


def test_a_table_edited_after_its_writer_wrote_it_is_refused(tmp_path):
    path = tmp_path / "s.parquet"
    files.write_table(_scores(), path, {"identity": {"kind": "scores", "role": "calibration"}})
    assert read(path, "--scores", SCORES).df.shape[0] == 36
    table = pq.read_table(path)
    copied = pd.concat([table.to_pandas(), table.to_pandas().iloc[[0]].assign(sample_id=9)], ignore_index=True)
    import pyarrow as pa

    pq.write_table(pa.Table.from_pandas(copied, preserve_index=False).replace_schema_metadata(table.schema.metadata),
                   tmp_path / "copied.parquet")
    with pytest.raises(DataError, match="its rows are not the rows its writer wrote"):
        read(tmp_path / "copied.parquet", "--scores", SCORES)
    meta = dict(table.schema.metadata)
    lara_meta = json.loads(meta[b"lara"])
    lara_meta["identity"]["role"] = "calibration "
    meta[b"lara"] = json.dumps(lara_meta).encode()
    pq.write_table(table.replace_schema_metadata(meta), tmp_path / "relabelled.parquet")
    with pytest.raises(DataError, match="its metadata is not what its writer wrote"):
        read(tmp_path / "relabelled.parquet", "--scores", SCORES)


def test_a_response_copied_under_a_new_sample_id_is_one_candidate(tmp_path):
    df = _scores()
    df.loc[1, "response"] = df.loc[0, "response"] + " "  # the same text up to spacing
    df.to_parquet(tmp_path / "s.parquet")  # written by hand: no identity, so not draws of lara sample
    with pytest.raises(DataError, match="prompt 'p0' has one response under 2 sample ids"):
        read(tmp_path / "s.parquet", "--scores", SCORES)
    # drawn by lara sample (its identity, sealed): a policy may draw one response twice, K i.i.d. draws
    files.write_table(df, tmp_path / "drawn.parquet", {"identity": {"kind": "scores"}})
    assert len(read(tmp_path / "drawn.parquet", "--scores", SCORES).df) == 36


@pytest.mark.parametrize("value, ok", [(True, True), ("false", True), ("True", False), ("1", False), (None, False),
                                       (1, False), (float("nan"), False)])
def test_booleans_are_booleans_or_the_literals(value, ok):
    if ok:
        assert strict_bool(value, "x") in (True, False)
    else:
        with pytest.raises(DataError, match="x: "):
            strict_bool(value, "x")


def test_kind_role_and_numbers_are_checked_by_the_row(tmp_path):
    path = tmp_path / "s.parquet"
    files.write_table(_scores(), path, {"identity": {"kind": "scores", "role": "test"}})
    with pytest.raises(DataError, match=r"--scores .*s.parquet: role test, expected calibration"):
        read(path, "--scores", SCORES)
    files.write_table(_scores(), path, {"identity": {"kind": "responses", "role": "calibration"}})
    with pytest.raises(DataError, match="kind responses, expected scores"):
        read(path, "--scores", SCORES)
    _scores().assign(cost="1.0").to_parquet(path)
    with pytest.raises(DataError, match="column 'cost' holds text '1.0', not a number"):
        read(path, "--scores", SCORES)


def test_a_json_record_with_nan_or_a_key_twice_is_refused_naming_the_key(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"tau": 1, "lambda_star": NaN}')
    with pytest.raises(DataError, match="lambda_star: not a finite number"):
        files.json_file(path)
    path.write_text('{"tau": 1, "tau": 2}')
    with pytest.raises(DataError, match="the key 'tau' is given twice"):
        files.json_file(path)


def test_whatever_two_inputs_state_must_agree(tmp_path):
    from lara.identity import Artifact

    a = Artifact("--candidates", "s.parquet", {"scenario": "heavy", "tau": 0.1})
    b = Artifact("--online", "o.parquet", {"scenario": "control", "tau": 0.1})
    with pytest.raises(DataError, match="o.parquet: made for another scenario than --candidates s.parquet"):
        agree("deploy-arms", {"--candidates": a, "--online": [b]})
    agree("deploy-arms", {"--candidates": a, "--online": [Artifact("--online", "o.parquet", {"scenario": "heavy"})]})
    c = Artifact("--online", "o.parquet", {"scenario": "heavy", "experiment": "other"})
    d = Artifact("--candidates", "s.parquet", {"scenario": "heavy", "experiment": "tiny"})
    with pytest.raises(DataError, match="experiment 'other'"):
        agree("deploy-arms", {"--candidates": d, "--online": [c]})


def test_a_weighted_lambda_of_another_calibration_set_is_not_deployed_beside_lambda_star(tmp_path):
    """deploy-arms compares the fixed arm's record with the weighted one: calibrated on the same calibration samples
    (their table's digest), or the weighted arm answers another question."""
    from lara.identity import Artifact

    def record(flag, kind, digest):
        ident = {"kind": kind, "tau": 0.1, "made_from": {"--scores": digest}}
        path = tmp_path / f"{flag[2:]}_{digest}.json"
        path.write_text("{}")
        return Artifact(flag, str(path), ident, None, {"tau": 0.1, "decoder": {"kind": "best_of_n", "n": 20}})

    plain = record("--lambda-json", "lambda", "aaaa")
    agree("deploy-arms", {"--lambda-json": plain, "--weighted": record("--weighted", "lambda_weighted", "aaaa")})
    with pytest.raises(DataError, match="made for another calibration_set"):
        agree("deploy-arms", {"--lambda-json": plain, "--weighted": record("--weighted", "lambda_weighted", "bbbb")})


def test_the_check_reads_each_declared_input_once(tmp_path, monkeypatch):
    path = tmp_path / "s.parquet"
    files.write_table(_scores(), path, {"identity": {"kind": "scores", "role": "calibration"}})
    calls = []
    real = files.READERS[".parquet"]
    monkeypatch.setitem(files.READERS, ".parquet", lambda p: calls.append(p) or real(p))
    files.forget()
    args = argparse.Namespace(command="calibrate", scores=str(path), weights=None)
    arts = check("calibrate", args)
    assert arts["--scores"].df.shape == (36, 6)
    files.read_table(path)
    files.read_table(path)
    assert len(calls) == 1


def test_a_vector_mode_command_compares_its_vector_inputs_fields(tmp_path):
    """online/deploy-arms --constraints read the vector row (a stream of constraint costs, the vector record): the
    fields compared are that row's, so a stream scored with the constraints' cost scorers swapped is refused (the
    one-cost row names cost_scorer, which a vector stream does not state)."""
    from types import SimpleNamespace

    from lara.identity import Artifact
    from lara.read.contracts import CONTRACTS, agree
    from lara.read.files import DataError

    scorers = {"violence": "models/cost_violence", "crime": "models/cost_crime"}
    swapped = {"violence": scorers["crime"], "crime": scorers["violence"]}
    stream = Artifact("--candidates", "s.parquet", {"kind": "stream", "cost_scorers": swapped})
    (tmp_path / "l.json").write_text("{}")
    record = Artifact("--lambda-json", str(tmp_path / "l.json"), {"kind": "lambda_vector", "cost_scorers": scorers},
                      data={})
    vector = CONTRACTS["online"].expects(SimpleNamespace(constraints="[...]"))
    with pytest.raises(DataError, match="another cost_scorers"):
        agree("online", {"--candidates": stream, "--lambda-json": record}, vector)
    agree("online", {"--candidates": stream, "--lambda-json": record})  # the one-cost row compares no cost_scorers
