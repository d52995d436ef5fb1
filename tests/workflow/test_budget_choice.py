"""The token-budget chooser on the finished toy run: three disjoint prompt sets, each budget's winner the best on the
selection prompts, its lambda* the calibration core's record of the same decoder (the Best-of-k records of the run
agree), its held-out numbers the sweep's, and the summary and the figure saying the same."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.workflow


@pytest.fixture(scope="module")
def choice(toy_run):
    res = toy_run / "results" / "tiny"
    return (json.loads((res / "decode" / "budget" / "choice.json").read_text()),
            pd.read_csv(res / "decode" / "budget" / "frontier.csv"), res)


def test_the_selection_prompts_are_a_third_disjoint_split(toy_run):
    res = toy_run / "results" / "tiny"
    cfg = yaml.safe_load((toy_run / "config" / "config.yaml").read_text())
    sets = {name: set(pd.read_parquet(res / "data" / f"prompts_{name}.parquet")["prompt_id"])
            for name in ("calibration", "test", "selection")}
    assert len(sets["selection"]) == cfg["data"]["prompts"]["n_selection"] > 0
    assert not sets["selection"] & (sets["calibration"] | sets["test"])
    sampled = pd.read_parquet(res / "selection" / "scores.parquet")
    assert set(sampled["prompt_id"]) == sets["selection"]
    assert sampled.groupby("prompt_id").size().eq(cfg["calibration"]["samples_per_prompt"]).all()


def test_each_budget_deploys_the_selection_winner_with_its_certificate_and_audit(choice, toy_run):
    from lara.stats import verdict

    doc, frontier, res = choice
    cfg = yaml.safe_load((toy_run / "config" / "config.yaml").read_text())
    assert [b["budget"] for b in doc["budgets"]] == cfg["decode"]["budget"]["budgets"]
    cands = pd.DataFrame(doc["candidates"])
    assert len(cands) == cfg["decode"]["bon_n"] + doc["search_space"]["schedules"]
    rows = frontier.set_index("name")
    for b in doc["budgets"]:
        fits = cands[cands["meets"] & (cands["mean_tokens"] <= b["tokens"] + 1e-9)]
        assert b["selection"]["mean_reward"] == pytest.approx(fits["mean_reward"].max())
        assert b["versus_best_of_k"]["selection_reward_gain"] >= -1e-12
        assert b["versus_best_of_k_in_budget"]["selection_reward_gain"] >= -1e-12
        h = b["held_out"]
        assert h["verdict"] == verdict(*h["one_sided95"], doc["tau"], h["n_prompts"])
        assert rows.loc[b["chosen"], "lambda_star"] == b["deployed"]["lambda_star"]
        assert f"{b['budget']:g}" in str(rows.loc[b["chosen"], "chosen_at"]).split()


def test_best_of_k_in_the_choice_is_the_run_s_own_best_of_k_record_and_sweep(choice):
    """The Best-of-k the chooser certifies is the calibration core's record that calibrate-best-of-k wrote for the same
    k, and its held-out reward is the sweep's row at that lambda (one decoder, one record, one audit)."""
    from lara.calibrate.record import read_lambda

    _, frontier, res = choice
    sweep = pd.read_csv(res / "decode" / "bon" / "sweep.csv")
    checked = 0
    for path in sorted((res / "calibration").glob("lambda_bon_k*.json")):
        rec = read_lambda(path)
        row = frontier.set_index("name").loc[f"best_of_k:{rec.decoder['n']}"]
        assert row["lambda_star"] == pytest.approx(rec.lambda_star, abs=1e-12)
        label = f"core:{rec.get('guarantee')['procedure']}"
        audited = sweep[(sweep["n"] == rec.decoder["n"]) & (sweep["label"] == label)]
        assert row["mean_reward"] == pytest.approx(float(audited["mean_reward"].iloc[0]), rel=1e-9)
        assert row["mean_cost"] == pytest.approx(float(audited["mean_cost"].iloc[0]), rel=1e-9)
        checked += 1
    assert checked >= 2


def test_the_summary_and_the_figure_say_what_to_deploy(choice):
    from lara.evaluate.summary import summarise_run

    doc, _, res = choice
    text = summarise_run(res)
    line = next(x for x in text.splitlines() if "at a token budget, deploy" in x)
    for b in doc["budgets"]:
        assert f"{b['tokens']:.0f} tokens" in line
    prov = json.loads((res / "figures" / "frontier.provenance.json").read_text())
    assert (res / "figures" / "frontier.png").stat().st_size > 0 and prov
