"""Calibration prompts from the reward/cost models' training partition: disjoint by text from the
test pool and from the pairs the trainers hold out for evaluation."""

import subprocess
import sys

import pandas as pd
import pytest

from lara.data.splits import held_out_pair_prompts, split_from_training
from lara.toy.world import ToyWorldSettings, generate
from lara.train.common import split_eval
from lara.train.preference import oriented_pairs

WORLD = generate(ToyWorldSettings(seed=2, n_sft=100, n_pairs=600, n_eval_prompts=300))


def test_held_out_prompts_are_the_trainers_own_evaluation_pairs():
    prefs = pd.DataFrame(WORLD["safe_rlhf"])
    for kind in ("reward", "cost"):
        _, evaluation = split_eval(oriented_pairs(prefs, kind), 0.1, 3)
        assert held_out_pair_prompts(prefs, [(0.1, 3)]) == {" ".join(p.split()) for p in evaluation["prompt"]}


def test_calibration_from_training_prompts_is_disjoint_from_test_and_held_out_pairs():
    prefs = pd.DataFrame(WORLD["safe_rlhf"])
    # a test pool that shares some prompts with the preference data, to prove they are removed
    pool = pd.Series([p["prompt"] for p in WORLD["prompts"]] + list(prefs["prompt"].iloc[:40]))
    cal, test = split_from_training(pool, prefs, 120, 100, seed=0, held_out=[(0.1, 0), (0.2, 0)])
    assert len(cal) == 120 and len(test) == 100
    cal_text, test_text = set(cal["prompt"]), set(test["prompt"])
    assert not cal_text & test_text
    assert not cal_text & {" ".join(p.split()) for p in pool}  # nothing of the test pool at all
    assert not cal_text & held_out_pair_prompts(prefs, [(0.1, 0), (0.2, 0)])
    assert cal_text <= {" ".join(p.split()) for p in prefs["prompt"]}  # from the training partition
    with pytest.raises(Exception, match="n_calibration = 5000"):
        split_from_training(pool, prefs, 5000, 100, seed=0, held_out=[(0.1, 0)])


def test_cli_draws_calibration_from_the_preferences(tmp_path):
    prefs = tmp_path / "preferences.parquet"
    pd.DataFrame(WORLD["safe_rlhf"]).to_parquet(prefs)
    pool = tmp_path / "pool.jsonl"
    pd.DataFrame(WORLD["prompts"]).to_json(pool, orient="records", lines=True)
    cal, test = tmp_path / "cal.parquet", tmp_path / "test.parquet"
    proc = subprocess.run([sys.executable, "-m", "lara", "split-prompts", "--source", str(pool),
                           "--n-calibration", "50", "--n-test", "40", "--calibration-preferences", str(prefs),
                           "--exclude-held-out", "0.1:0",
                           "--calibration", str(cal), "--test", str(test)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    c, t = pd.read_parquet(cal), pd.read_parquet(test)
    assert len(c) == 50 and len(t) == 40 and not set(c["prompt"]) & set(t["prompt"])
    assert set(c["prompt"]) <= set(pd.read_parquet(prefs)["prompt"].map(lambda p: " ".join(p.split())))


# ---------------------------------------------------------------------------------------------
# the CD-Q value models' training prompts


def test_value_prompts_mix_safety_and_instruction_prompts_and_avoid_the_splits():
    from lara.data.value_prompts import ValuePromptSettings, draw

    sft = pd.Series([f"how do i cook dish {i} ?" for i in range(300)] * 2)  # every prompt twice
    safety = pd.Series([f"how can i hurt person {i} ?" for i in range(200)])
    excluded = {f"how can i hurt person {i} ?" for i in range(0, 200, 2)} | {"how do i cook dish 7 ?"}
    out = draw(sft, safety, excluded, ValuePromptSettings(n_prompts=60, safety_fraction=0.5, seed=3))
    assert len(out) == 60 and out["prompt"].is_unique and out["prompt_id"].is_unique
    assert (out["source"] == "safety").sum() == 30 and (out["source"] == "instruction").sum() == 30
    assert not set(out["prompt"]) & excluded
    assert set(out.loc[out["source"] == "safety", "prompt"]) <= set(safety)
    # seeded: the same draw again, another seed another draw
    again = draw(sft, safety, excluded, ValuePromptSettings(n_prompts=60, safety_fraction=0.5, seed=3))
    pd.testing.assert_frame_equal(out, again)
    other = draw(sft, safety, excluded, ValuePromptSettings(n_prompts=60, safety_fraction=0.5, seed=4))
    assert set(other["prompt"]) != set(out["prompt"])
    only = draw(sft, safety, excluded, ValuePromptSettings(n_prompts=10, safety_fraction=0.0, seed=3))
    assert (only["source"] == "instruction").all()


def test_value_prompts_refuse_to_come_up_short():
    from lara.data.value_prompts import ValuePromptSettings, draw
    from lara.read.files import DataError

    safety = pd.Series([f"q{i}" for i in range(10)])
    with pytest.raises(DataError, match=r"prefs.parquet: 5 distinct prompts outside the calibration and test splits, "
                                        r"but data.value_prompts wants 8 safety prompts"):
        draw(pd.Series(["a", "b"]), safety, {f"q{i}" for i in range(5)},
             ValuePromptSettings(n_prompts=16, safety_fraction=0.5), ("sft.parquet", "prefs.parquet"))


def test_unicode_equivalent_prompts_are_one_prompt():
    """NFC/NFD spellings, a zero-width space, a soft hyphen or a non-breaking space do not make a second
    prompt: equivalent prompts are deduplicated before splitting, so none lands in both splits."""
    import unicodedata

    from lara.data.splits import prompt_key, split_prompts
    from lara.read.files import DataError

    base = [f"Où est le café numéro {i} ?" for i in range(30)]
    variants = ([unicodedata.normalize("NFD", t) for t in base] + [t.replace("est", "e\u200bst") for t in base]
                + [t.replace("numéro", "nu\u00adméro") for t in base] + [t.replace(" ", "\u00a0", 1) for t in base])
    cal, test = split_prompts(pd.Series(base + variants), 15, 15, seed=0)
    keys = {"cal": set(cal["prompt"].map(prompt_key)), "test": set(test["prompt"].map(prompt_key))}
    assert len(keys["cal"]) == 15 and len(keys["test"]) == 15 and not keys["cal"] & keys["test"]
    assert not set(cal["prompt_id"]) & set(test["prompt_id"])
    with pytest.raises(DataError, match="30 distinct prompts"):
        split_prompts(pd.Series(base + variants), 16, 15, seed=0)
