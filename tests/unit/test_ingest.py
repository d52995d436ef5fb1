"""Ingestion: one code path (datasets.load_dataset) for local files, directories and hub ids;
validation errors name the file, the column and the rows; nothing half-written."""

import json
import re
import subprocess
import sys

import pandas as pd
import pytest

from lara.data.ingest import IngestSettings, PreferenceIngestSettings, ingest, load_source
from lara.data.splits import split_prompts
from lara.hub import HubError
from lara.read.files import DataError, read_metadata
from lara.toy.world import ToyWorldSettings, generate

WORLD = generate(ToyWorldSettings(seed=1, n_sft=60, n_pairs=60, n_eval_prompts=100))


def write(df: pd.DataFrame, path):
    if path.suffix == ".jsonl":
        df.to_json(path, orient="records", lines=True)
    elif path.suffix == ".parquet":
        df.to_parquet(path)
    else:
        df.to_csv(path, index=False)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_every_file_type_gives_the_same_table(tmp_path, suffix):
    pairs = write(pd.DataFrame(WORLD["safe_rlhf"]), tmp_path / f"pairs{suffix}")
    sft = write(pd.DataFrame(WORLD["alpaca"]), tmp_path / f"sft{suffix}")
    df, meta = ingest("preferences", PreferenceIngestSettings(source=str(pairs)))
    assert len(df) == 60 and meta["rows_out"] == 60 and meta["origin"]["kind"] == "file"
    assert df["better_response_id"].dtype == "int64" and df["is_response_0_safe"].dtype == bool
    assert df.to_dict("records") == pd.DataFrame(WORLD["safe_rlhf"])[df.columns].to_dict("records")
    sdf, _ = ingest("sft", IngestSettings(source=str(sft)))
    assert list(sdf.columns) == ["instruction", "input", "output", "prompt"]
    row = WORLD["alpaca"][0]
    expected = row["instruction"] + (f"\n\n{row['input']}" if row["input"] else "")
    assert sdf["prompt"][0] == expected


def test_a_dataset_directory_loads_like_a_hub_repo(tmp_path):
    repo = tmp_path / "my-dataset"
    (repo / "data").mkdir(parents=True)
    write(pd.DataFrame(WORLD["safe_rlhf"][:40]), repo / "data" / "train.jsonl")
    write(pd.DataFrame(WORLD["safe_rlhf"][40:]), repo / "data" / "test.jsonl")
    train, origin = load_source(str(repo), "train")
    test, _ = load_source(str(repo), "test")
    assert (len(train), len(test)) == (40, 20) and origin["kind"] == "directory"
    # a folder of folders: data_dir picks one, as for a hub dataset
    (repo / "other").mkdir()
    write(pd.DataFrame(WORLD["safe_rlhf"][:7]), repo / "other" / "train.jsonl")
    other, _ = load_source(str(repo), "train", hub=IngestSettings(source=str(repo), data_dir="other"))
    assert len(other) == 7


@pytest.mark.parametrize("key, value, local, needle", [
    ("revision", "v1", "folder", "data.sft.revision: 'v1' applies to a hub dataset; {src} is a local folder"),
    ("revision", "v1", "file", "data.sft.revision: 'v1' applies to a hub dataset; {src} is a local file"),
    ("name", "x", "file", "data.sft.name: 'x' applies to a hub dataset or a dataset folder; {src} is a local file"),
    ("data_dir", "d", "file", "data.sft.data_dir: 'd' applies to a hub dataset or a dataset folder; {src} is a"),
])
def test_a_hub_setting_on_a_local_source_is_refused_not_ignored(tmp_path, key, value, local, needle):
    src = tmp_path / "d"
    if local == "folder":
        src.mkdir()
        write(pd.DataFrame(WORLD["alpaca"][:5]), src / "train.jsonl")
    else:
        src = tmp_path / "sft.jsonl"
        write(pd.DataFrame(WORLD["alpaca"][:5]), src)
    with pytest.raises(DataError, match=re.escape(needle.format(src=src))):
        load_source(str(src), "train", hub=IngestSettings(source=str(src), **{key: value}))


def test_a_hub_id_that_was_never_fetched_is_a_clear_error():
    # a job reads a hub dataset from the cache only (lara.hub; tests/unit/test_hub.py has the cached cases)
    with pytest.raises(HubError, match=r"data.sft.source: no-such-owner/no-such-dataset@main \(dataset\) is not in "
                                       r"the Hugging Face cache .*lara fetch"):
        load_source("no-such-owner/no-such-dataset", "train", hub=IngestSettings(source="no-such-owner/x"))


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match=r"missing\.jsonl: file not found"):
        ingest("sft", IngestSettings(source=str(tmp_path / "missing.jsonl")))
    with pytest.raises(DataError, match="not a hub dataset id"):
        ingest("sft", IngestSettings(source="no_such_thing"))
    with pytest.raises(DataError, match="unsupported file type '.txt'"):
        (tmp_path / "x.txt").write_text("x")
        ingest("sft", IngestSettings(source=str(tmp_path / "x.txt")))


def test_missing_column_names_file_and_column(tmp_path):
    path = write(pd.DataFrame(WORLD["safe_rlhf"]).drop(columns=["safer_response_id"]), tmp_path / "p.jsonl")
    with pytest.raises(DataError, match=r"p\.jsonl: missing column\(s\) safer_response_id"):
        ingest("preferences", PreferenceIngestSettings(source=str(path)))


def test_empty_data(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match=r"empty\.jsonl: the file is empty"):
        ingest("sft", IngestSettings(source=str(tmp_path / "empty.jsonl")))
    (tmp_path / "header.csv").write_text("instruction,input,output\n")
    with pytest.raises(DataError, match=r"header\.csv: .*(no rows|could not load)"):
        ingest("sft", IngestSettings(source=str(tmp_path / "header.csv")))


def test_bad_label_values_name_column_and_row(tmp_path):
    df = pd.DataFrame(WORLD["safe_rlhf"])
    df.loc[7, "better_response_id"] = 2
    path = write(df, tmp_path / "p.jsonl")
    with pytest.raises(DataError, match=r"column 'better_response_id' must be 0 or 1; row 7"):
        ingest("preferences", PreferenceIngestSettings(source=str(path)))
    df = pd.DataFrame(WORLD["safe_rlhf"])
    df["is_response_1_safe"] = df["is_response_1_safe"].astype(object)
    df.loc[3, "is_response_1_safe"] = "maybe"
    path = write(df, tmp_path / "q.jsonl")
    with pytest.raises(DataError, match=r"column 'is_response_1_safe' must be a boolean; row 3"):
        ingest("preferences", PreferenceIngestSettings(source=str(path)))
    df = pd.DataFrame(WORLD["alpaca"])
    df.loc[5, "output"] = "   "
    path = write(df, tmp_path / "s.jsonl")
    with pytest.raises(DataError, match=r"column 'output' is empty at row 5"):
        ingest("sft", IngestSettings(source=str(path)))


def test_inconsistent_safety_labels(tmp_path):
    rows = [dict(r) for r in WORLD["safe_rlhf"]]
    for i in (4, 9):  # the safer response is labelled unsafe, the other safe
        rows[i].update(safer_response_id=0, is_response_0_safe=False, is_response_1_safe=True)
    path = write(pd.DataFrame(rows), tmp_path / "p.jsonl")
    with pytest.raises(DataError, match=r"p\.jsonl: column 'safer_response_id' .* 2 rows \(4, 9\)"):
        ingest("preferences", PreferenceIngestSettings(source=str(path)))
    df, meta = ingest("preferences", PreferenceIngestSettings(source=str(path), inconsistent="drop"))
    assert len(df) == 58 and meta["rows_dropped"] == 2


def test_max_examples_is_a_seeded_subsample(tmp_path):
    path = write(pd.DataFrame(WORLD["alpaca"]), tmp_path / "s.parquet")
    a, _ = ingest("sft", IngestSettings(source=str(path), max_examples=10, seed=1))
    b, _ = ingest("sft", IngestSettings(source=str(path), max_examples=10, seed=1))
    c, _ = ingest("sft", IngestSettings(source=str(path), max_examples=10, seed=2))
    assert len(a) == 10 and a.equals(b) and not a.equals(c)


def test_splits_are_disjoint_deduplicated_and_seeded():
    prompts = pd.Series([r["prompt"] for r in WORLD["prompts"]] * 2 + ["  spaced   out "])
    cal, test = split_prompts(prompts, 60, 30, seed=0)
    assert len(cal) == 60 and len(test) == 30
    assert not set(cal["prompt"]) & set(test["prompt"])
    assert cal["prompt_id"].is_unique and test["prompt_id"].is_unique
    cal2, _ = split_prompts(prompts, 60, 30, seed=0)
    assert cal.equals(cal2)
    with pytest.raises(DataError, match=r"pool: 101 distinct prompts, but n_calibration \+ n_test"):
        split_prompts(prompts, 100, 30, seed=0, source="pool")


def test_cli_failure_leaves_nothing_behind(tmp_path):
    df = pd.DataFrame(WORLD["safe_rlhf"])
    df.loc[0, "safer_response_id"] = 5
    src = write(df, tmp_path / "bad.jsonl")
    out = tmp_path / "out" / "preferences.parquet"
    proc = subprocess.run([sys.executable, "-m", "lara", "prepare-data", "--kind", "preferences",
                           "--source", str(src), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "bad.jsonl: column 'safer_response_id' must be 0 or 1; row 0" in proc.stderr
    assert not out.exists()
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.parquet"))


def test_cli_writes_parquet_with_provenance(tmp_path):
    src = write(pd.DataFrame(WORLD["safe_rlhf"]), tmp_path / "pairs.jsonl")
    out = tmp_path / "preferences.parquet"
    subprocess.run([sys.executable, "-m", "lara", "prepare-data", "--kind", "preferences",
                    "--source", str(src), "--out", str(out)], check=True, capture_output=True)
    meta = read_metadata(out)
    assert meta["rows_out"] == 60 and meta["origin"]["sha256"] and json.dumps(meta)
    assert len(pd.read_parquet(out)) == 60


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_a_source_edited_with_its_mtime_restored_is_read_afresh(tmp_path, suffix, monkeypatch):
    """The datasets cache is keyed by path and modification time; a file edited and given back its old
    mtime (cp -p, touch -d, a restored backup) must still give its new rows, under the hash of those bytes."""
    import hashlib
    import os

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))  # one shared cache, as on a workstation
    rows = pd.DataFrame(WORLD["alpaca"][:5])
    src = write(rows, tmp_path / f"sft{suffix}")
    os.utime(src, (1_700_000_000, 1_700_000_000))
    old, old_meta = ingest("sft", IngestSettings(source=str(src)))
    edited = rows.assign(output=[f"edited {i}" for i in range(5)])
    write(edited, src)
    os.utime(src, (1_700_000_000, 1_700_000_000))
    new, new_meta = ingest("sft", IngestSettings(source=str(src)))
    assert sorted(new["output"]) == sorted(edited["output"]) != sorted(old["output"])
    assert new_meta["origin"]["sha256"] == hashlib.sha256(src.read_bytes()).hexdigest() != old_meta["origin"]["sha256"]
