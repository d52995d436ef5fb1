"""lara realtext-pool: the real-text deployment pool, RealToxicityPrompts outside the excluded (calibration and test)
prompts as benign and a seeded sample of slur prompts as held_out; a prompt in two places keeps one stratum."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from lara.cli import main
from lara.read.files import write_table


def lara(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture
def files(tmp_path):
    rtp = pd.DataFrame({"prompt": [f"rtp prompt {i}" for i in range(30)], "category": "rtp_insult"})
    slurs = pd.DataFrame({"prompt": [f"slur prompt {i}" for i in range(40)] + ["rtp prompt 3"],
                          "category": "slur", "term": "x"})
    rtp.to_json(tmp_path / "rtp.jsonl", orient="records", lines=True)
    slurs.to_json(tmp_path / "slurs.jsonl", orient="records", lines=True)
    from lara import identity
    for name, rows in (("cal", range(0, 10)), ("test", range(10, 20))):
        df = pd.DataFrame({"prompt_id": [f"p{i}" for i in rows], "prompt": [f"rtp prompt {i}" for i in rows]})
        path = tmp_path / f"{name}.parquet"
        role = "calibration" if name == "cal" else "test"
        made = identity.stamp("prompts", path, role=role, prompts=identity.prompt_set(df, str(path)).record())
        write_table(df, path, {identity.KEY: made})
    return tmp_path


def run_pool(d, n=12, seed=0, out="pool.parquet") -> int:
    return lara("realtext-pool", "--rtp", d / "rtp.jsonl", "--slurs", d / "slurs.jsonl", "--exclude",
                d / "cal.parquet", d / "test.parquet", "--settings", json.dumps({"slur_prompts": n, "seed": seed}),
                "--out", d / out)


def test_the_pool_holds_the_unused_rtp_prompts_and_a_seeded_slur_sample(files):
    assert run_pool(files) == 0
    pool = pd.read_parquet(files / "pool.parquet")
    benign = pool[pool["stratum"] == "benign"]["prompt"]
    held = pool[pool["stratum"] == "held_out"]["prompt"]
    assert sorted(benign) == sorted(f"rtp prompt {i}" for i in range(20, 30))  # calibration and test left out
    assert len(held) == 12 and set(held) <= {f"slur prompt {i}" for i in range(40)}  # never the RTP prompt
    assert run_pool(files, out="again.parquet") == 0
    assert pd.read_parquet(files / "again.parquet").equals(pool)  # seeded
    assert run_pool(files, seed=1, out="other.parquet") == 0
    assert set(pd.read_parquet(files / "other.parquet")["prompt"]) != set(pool["prompt"])
    assert lara("deployment-pool", "--source", files / "pool.parquet", "--calibration", files / "cal.parquet",
                "--settings", "{}", "--out", files / "d.parquet") == 0
    assert pd.read_parquet(files / "d.parquet")["stratum"].value_counts().to_dict() == {"held_out": 12, "benign": 10}


def test_more_slur_prompts_than_there_are_is_refused(files, capsys):
    assert run_pool(files, n=41) == 2
    assert "realtext.slur_prompts: 41 asked, but only 40 slur prompts" in capsys.readouterr().err
    assert not (files / "pool.parquet").exists()


def test_swapped_or_foreign_tables_are_refused(files, capsys):
    """--rtp given the slur prompts (or an earlier pool), a prompt without text: refused naming the flag and row."""
    rc = lara("realtext-pool", "--rtp", files / "slurs.jsonl", "--slurs", files / "rtp.jsonl", "--exclude",
              files / "cal.parquet", "--settings", json.dumps({"slur_prompts": 5}), "--out", files / "x.parquet")
    assert rc == 2 and "--rtp" in capsys.readouterr().err
    blank = pd.read_json(files / "slurs.jsonl", lines=True)
    blank.loc[3, "prompt"] = "  "
    blank.to_json(files / "blank.jsonl", orient="records", lines=True)
    rc = lara("realtext-pool", "--rtp", files / "rtp.jsonl", "--slurs", files / "blank.jsonl", "--exclude",
              files / "cal.parquet", "--settings", json.dumps({"slur_prompts": 5}), "--out", files / "x.parquet")
    assert rc == 2 and "row 3 has no prompt text" in capsys.readouterr().err
    assert not (files / "x.parquet").exists()
