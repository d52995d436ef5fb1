"""The token-budget chooser (``lara choose-decoder``, lara.decode.budget) on seeded synthetic worlds, through the real
command: where the prefix scores carry the full scores' signal a pruned schedule buys Best-of-N's reward for fewer
tokens and is chosen; where they carry none, Best-of-k is chosen at every budget. Every number asserted is a property
(a winner's definition, an equality with the calibration core's own record, an inequality), never one machine's
float."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from lara.calibrate import procedures
from lara.calibrate.best_of_k import BestOfK
from lara.cli import main
from lara.decode.budget import BudgetSettings, choose, frontier, name_of

N, K = 6, 6  # Best-of-N's N; samples per selection and calibration prompt (the test prompts' candidates: N)
TAU = 0.0
CHECKPOINTS = (2, 4)
SETTINGS = {"budgets": [0.3, 0.6, 240], "checkpoints": list(CHECKPOINTS), "keep": [1, 2, 3], "max_checkpoints": 2,
            "ties": ["index", "keep"], "n": N, "max_new_tokens": 48, "grid_points": 61, "max_subsets": 50,
            "eval_bootstrap": 400, "seed": 0, "tau": TAU, "lambda_search_max": 3.0, "bootstrap": 400,
            "quantile": 0.9, "guarantee": "bootstrap", "delta": 0.1, "cost_bounds": [-4.0, 4.0]}


def write_split(path, role: str, prompts: int, k: int, seed: int, signal: float, ids: str | None = None) -> None:
    """A prefix-scores table of ``role``: per prompt ``k`` samples, reward and cost correlated (a rewarding response
    is costly), lengths 20-40 tokens, and prefix scores at each checkpoint equal to ``signal`` times the full score
    plus noise (signal 0: prefixes say nothing), stamped as lara score-prefixes stamps them."""
    from lara import identity
    from lara.read.files import write_table

    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        z = rng.normal(size=(2, k))
        reward, cost = 2 * z[0], np.clip(0.7 * z[0] + 0.7 * z[1] + 0.3, -3.5, 3.5)
        for j in range(k):
            name = ids or role
            row = {"prompt_id": f"{name[:3]}{seed}_{p}", "sample_id": j, "prompt": f"{name} prompt {seed} {p}",
                   "response": f"response {j} of {name} prompt {p}", "n_tokens": int(rng.integers(20, 41)),
                   "reward": reward[j], "cost": cost[j]}
            for t in CHECKPOINTS:
                row[f"prefix_reward_{t}"] = signal * reward[j] + 0.3 * rng.normal()
                row[f"prefix_cost_{t}"] = signal * cost[j] + 0.3 * rng.normal()
            rows.append(row)
    df = pd.DataFrame(rows)
    made = identity.stamp("prefix_scores", path, role=role, per_prompt=k,
                          prompts=identity.prompt_set(df, str(path)).record(), reward_scorer="hand reward",
                          cost_scorer="hand cost", checkpoints=list(CHECKPOINTS), prefix_reward_scorer="hand prefix",
                          prefix_cost_scorer="hand prefix cost")
    write_table(df, path, {"checkpoints": list(CHECKPOINTS), identity.KEY: made})


def run_chooser(tmp_path, signal: float, settings=None, **swap) -> tuple[int, dict | None, pd.DataFrame | None]:
    paths = {role: tmp_path / f"{role}.parquet" for role in ("selection", "calibration", "test")}
    sizes = {"selection": (80, K, 1), "calibration": (120, K, 2), "test": (100, N, 3)}
    for role, path in paths.items():
        if not path.exists():
            write_split(path, role, *sizes[role], signal)
    paths |= swap
    out, table = tmp_path / "choice.json", tmp_path / "frontier.csv"
    rc = main(["choose-decoder", "--selection", str(paths["selection"]), "--calibration", str(paths["calibration"]),
               "--test", str(paths["test"]), "--settings", json.dumps(settings or SETTINGS), "--out", str(out),
               "--table", str(table)])
    if rc:
        return rc, None, None
    return rc, json.loads(out.read_text()), pd.read_csv(table)


@pytest.fixture(scope="module")
def informative(tmp_path_factory):
    return run_chooser(tmp_path_factory.mktemp("informative"), signal=1.0)


@pytest.fixture(scope="module")
def uninformative(tmp_path_factory):
    return run_chooser(tmp_path_factory.mktemp("noise"), signal=0.0)


def test_each_winner_is_the_best_that_meets_tau_within_its_budget_on_the_selection_split(informative):
    rc, doc, _ = informative
    assert rc == 0
    cands = pd.DataFrame(doc["candidates"])
    assert len(cands) == N + 2 * (2 * 3 + 1 * 3)  # Best-of-1..N; 6 one- and 3 two-checkpoint schedules, 2 rules
    full = doc["full_best_of_n_tokens"]
    for b in doc["budgets"]:
        tokens = b["budget"] * full if b["budget"] < 1 else b["budget"]
        assert b["tokens"] == pytest.approx(tokens)
        fits = cands[cands["meets"] & (cands["mean_tokens"] <= tokens + 1e-9)]
        win = fits.set_index("name").loc[b["chosen"]]
        assert win["mean_reward"] == pytest.approx(fits["mean_reward"].max())
        assert b["selection"]["mean_cost"] <= TAU + 1e-12
        cheaper = fits[(fits["kind"] == "best_of_k") & (fits["mean_tokens"] <= win["mean_tokens"] + 1e-9)]
        if b["best_of_k"] is None:  # no Best-of-k that meets tau is as cheap as the winner
            assert cheaper.empty and b["versus_best_of_k"] is None
            continue
        assert b["best_of_k"] == cheaper.sort_values("mean_reward").iloc[-1]["name"]
        assert b["versus_best_of_k"]["selection_reward_gain"] >= -1e-12  # by construction on the selection split
        in_budget = fits[fits["kind"] == "best_of_k"].sort_values("mean_reward").iloc[-1]["name"]
        assert b["best_of_k_in_budget"] == in_budget
        assert b["versus_best_of_k_in_budget"]["selection_reward_gain"] >= -1e-12


def test_informative_prefixes_make_a_pruned_schedule_win_and_the_test_prompts_confirm_it(informative):
    _, doc, table = informative
    won = [b for b in doc["budgets"] if not b["chosen"].startswith("best_of_k:")]
    assert won, [b["chosen"] for b in doc["budgets"]]
    for b in won:
        if b["versus_best_of_k"] is None:
            continue
        gain = b["versus_best_of_k"]["test_reward_gain"]
        assert gain["ci95"][0] <= gain["mean"] <= gain["ci95"][1]
        assert gain["mean"] > 0  # prefixes that rank like the full scores keep the best candidates
        assert b["chosen"] in set(table["name"])
        assert table.set_index("name").loc[b["chosen"], "chosen_at"]


def test_uninformative_prefixes_leave_best_of_k_the_choice_at_every_budget(uninformative):
    rc, doc, table = uninformative
    assert rc == 0
    cands = pd.DataFrame(doc["candidates"])
    chosen = [b for b in doc["budgets"] if b["chosen"] is not None]
    assert len(chosen) >= 2
    for b in doc["budgets"]:
        if b["chosen"] is None:  # nothing that meets tau is this cheap
            assert not (cands["meets"] & (cands["mean_tokens"] <= b["tokens"])).any()
    for b in chosen:
        assert b["chosen"].startswith("best_of_k:") and b["chosen"] == b["best_of_k"]
        assert b["versus_best_of_k"]["test_reward_gain"]["mean"] == 0.0
    bok = table[table["kind"] == "best_of_k"]
    assert list(bok["name"]) == [f"best_of_k:{k}" for k in range(1, N + 1)]  # the whole Best-of-k line is drawn


def test_the_winner_is_certified_by_the_calibration_core_and_audited_held_out(tmp_path, informative):
    """The deployed lambda* is the core's record of that decoder on the calibration prompts, and the held-out
    verdict follows from its own bounds."""
    from lara.calibrate.pruned import PrefixScores, PrunedBestOfN, make_schedule
    from lara.read.candidates import read_prefix_scores
    from lara.stats import verdict

    _, doc, _ = informative
    s = BudgetSettings.from_mapping(SETTINGS)
    cal = doc["splits"]["calibration"]["path"]
    ids, arrays, _, _ = read_prefix_scores(cal, CHECKPOINTS, "cal")
    for b in doc["budgets"]:
        dec = b["deployed"]["decoder"]
        if dec["kind"] == "best_of_k":
            d = BestOfK(*arrays[:3], dec["n"], N)
        else:
            sch = dec["schedule"]
            schedule = make_schedule(N, sch["checkpoints"], sch["keep"], 48, sch.get("ties", "index"))
            cols = [CHECKPOINTS.index(t) for t in schedule.checkpoints]
            d = PrunedBestOfN(PrefixScores(*arrays[:3], arrays[3][..., cols], arrays[4][..., cols]), schedule, 50, 0)
            assert name_of(schedule) == b["chosen"]
        rec = procedures.calibrate(d, s, arrays[1], "cal")
        assert rec["lambda_star"] == b["deployed"]["lambda_star"]
        h = b["held_out"]
        assert h["verdict"] == verdict(*h["one_sided95"], TAU, h["n_prompts"])


def test_choose_prefers_best_of_k_on_a_tie_and_says_nothing_fits_below_every_candidate():
    table = pd.DataFrame({"name": ["best_of_k:2", "pruned:1@2", "best_of_k:1"],
                          "kind": ["best_of_k", "pruned", "best_of_k"], "meets": [True, True, False],
                          "mean_reward": [1.0, 1.0, 0.5], "mean_tokens": [40.0, 40.0, 20.0]})
    assert choose(table, 50.0) == ("best_of_k:2", "best_of_k:2", "best_of_k:2")
    assert choose(table, 30.0) == (None, None, None)  # Best-of-1 fits but misses tau
    assert frontier(table) == ["pruned:1@2"]


@pytest.mark.parametrize("change, words", [
    ({"budgets": [0.5, 0.5]}, "names a budget twice"),
    ({"budgets": [2.5]}, "neither a whole number"),
    ({"keep": [6]}, "not below decode.bon_n"),
    ({"checkpoints": [48]}, "not below generation.max_new_tokens"),
    ({"ties": ["first"]}, "decode.budget.ties"),
    ({"checkpoints": []}, "needs both"),
])
def test_a_search_space_or_budget_that_cannot_mean_what_it_says_is_refused(tmp_path, capsys, change, words):
    rc, _, _ = run_chooser(tmp_path, 1.0, SETTINGS | change)
    assert rc != 0
    assert words in capsys.readouterr().err
    assert not (tmp_path / "choice.json").exists() and not (tmp_path / "frontier.csv").exists()


def test_prompt_sets_must_be_disjoint_and_each_in_its_role(tmp_path, capsys):
    run_chooser(tmp_path, 1.0)
    (tmp_path / "choice.json").unlink()
    (tmp_path / "frontier.csv").unlink()
    for swap, words in (({"selection": tmp_path / "calibration.parquet"}, "role calibration, expected selection"),
                        ({"test": tmp_path / "selection.parquet"}, "role selection, expected test")):
        rc, _, _ = run_chooser(tmp_path, 1.0, **swap)
        assert rc != 0 and words in capsys.readouterr().err
        assert not (tmp_path / "choice.json").exists()
    shared = tmp_path / "shared.parquet"  # a selection split drawn on the calibration prompts themselves
    write_split(shared, "selection", 120, K, 2, 1.0, ids="calibration")
    rc, _, _ = run_chooser(tmp_path, 1.0, selection=shared)
    assert rc != 0 and "must be disjoint" in capsys.readouterr().err


def test_the_selection_split_is_a_third_cut_that_leaves_calibration_and_test_as_they_were():
    from lara.data.splits import split_prompts

    pool = pd.Series([f"request number {i}" for i in range(90)])
    cal, test = split_prompts(pool, 30, 40, seed=3)
    cal2, test2, sel = split_prompts(pool, 30, 40, seed=3, n_selection=20)
    assert cal.equals(cal2) and test.equals(test2)
    assert len(sel) == 20
    assert not set(sel["prompt_id"]) & (set(cal["prompt_id"]) | set(test["prompt_id"]))
    with pytest.raises(Exception, match="n_selection"):
        split_prompts(pool, 30, 40, seed=3, n_selection=21)


def test_an_output_that_is_an_input_or_the_other_output_is_refused_before_computing(tmp_path, capsys):
    run_chooser(tmp_path, 1.0)
    before = (tmp_path / "selection.parquet").read_bytes()
    for table in (tmp_path / "selection.parquet", tmp_path / "choice.json"):
        rc = main(["choose-decoder", "--selection", str(tmp_path / "selection.parquet"), "--calibration",
                   str(tmp_path / "calibration.parquet"), "--test", str(tmp_path / "test.parquet"), "--settings",
                   json.dumps(SETTINGS), "--out", str(tmp_path / "choice.json"), "--table", str(table)])
        assert rc != 0 and "--table" in capsys.readouterr().err.strip().splitlines()[-1]
    assert (tmp_path / "selection.parquet").read_bytes() == before


def test_a_column_that_only_looks_like_a_prefix_score_is_not_read_as_a_checkpoint(tmp_path):
    from lara.read.candidates import read_prefix_scores

    path = tmp_path / "selection.parquet"
    write_split(path, "selection", 4, K, 1, 1.0)
    df = pd.read_parquet(path)
    df["prefix_reward_x"] = 1.0
    plain = tmp_path / "plain.parquet"
    df.to_parquet(plain)
    ids, arrays, _, _ = read_prefix_scores(plain, CHECKPOINTS, "--selection")
    assert arrays[3].shape == (4, K, len(CHECKPOINTS))


def test_the_summary_refuses_a_choice_made_for_another_tau_or_procedure(tmp_path):
    from types import SimpleNamespace

    from lara import identity
    from lara.evaluate.summary import read_choice
    from lara.io import write_json
    from lara.read.files import DataError

    root = tmp_path / "results" / "x"
    path = root / "decode" / "budget" / "choice.json"
    path.parent.mkdir(parents=True)
    write_json(path, {"budgets": [], "tau": -0.3, "procedure": "bootstrap",
                      identity.KEY: identity.stamp("budget_choice", path, tau=-0.3, procedure="bootstrap")})
    record = {"guarantee": {"procedure": "bootstrap"}}
    ours = SimpleNamespace(tau=-0.3, path="lambda.json", get=record.get)
    assert read_choice(root, ours)["tau"] == -0.3
    for lam in (SimpleNamespace(tau=-0.5, path="lambda.json", get=record.get),
                SimpleNamespace(tau=-0.3, path="lambda.json", get={"guarantee": {"procedure": "crc"}}.get)):
        with pytest.raises(DataError, match="rerun lara choose-decoder"):
            read_choice(root, lam)
