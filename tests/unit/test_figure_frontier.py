"""`lara figure --kind frontier` (lara.evaluate.figures.frontier): the token-budget chooser's frontier.csv and
choice.json, written the way `lara choose-decoder` writes them, drawn with a provenance sidecar; a frontier without
a column it needs, an edited verdict or a choice of a decoder the frontier does not list refused in one line, with
no output left behind."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from lara import identity
from lara.cli import main
from lara.io import write_json
from lara.stats import VERDICTS, verdict

TAU, PROMPTS, N = -0.5, 64, 6
# a pruned schedule: (name, tokens, reward, upper bound of its mean cost)
PRUNED = (("pruned:3@2", 70.0, 1.6, -0.9), ("pruned:2@2,1@4", 55.0, 1.1, -0.3))


def _row(name, kind, tokens, reward, upper, chosen_at=""):
    lower = upper - 0.6
    return {"name": name, "kind": kind, "selection_lambda": 0.2, "selection_meets": True, "selection_reward": reward,
            "selection_tokens": tokens, "lambda_star": round(tokens / 500, 2), "feasible": True, "tokens": tokens,
            "mean_reward": reward, "mean_reward_lo": reward - 0.2, "mean_reward_hi": reward + 0.2,
            "mean_cost": upper - 0.3, "mean_cost_lower": lower, "mean_cost_upper": upper,
            "verdict": verdict(lower, upper, TAU, PROMPTS), "tau": TAU, "chosen_at": chosen_at, "n_prompts": PROMPTS}


def write_inputs(root):
    """results/x/decode/budget/{frontier.csv, choice.json} (choice.json stamped and sealed as its step writes it)
    and results/x/settings.tsv."""
    out = root / "results" / "x" / "decode" / "budget"
    out.mkdir(parents=True)
    rows = [_row(f"best_of_k:{k}", "best_of_k", 25.0 * k, 3 * np.log(k) + 0.1, -0.4 if k == 3 else -0.8,
                 {2: "0.25", 4: "0.5"}.get(k, "")) for k in range(1, N + 1)]
    rows += [_row(name, "pruned", *rest) for name, *rest in PRUNED]
    frontier = out / "frontier.csv"
    pd.DataFrame(rows).to_csv(frontier, index=False)
    choice = out / "choice.json"
    budgets = [{"budget": 0.25, "tokens": 52.0, "chosen": "best_of_k:2", "best_of_k": "best_of_k:2"},
               {"budget": 0.5, "tokens": 101.0, "chosen": "best_of_k:4", "best_of_k": "best_of_k:4"}]
    write_json(choice, {"budgets": budgets, "tau": TAU, "procedure": "bootstrap",
                        "splits": {"selection": {"n_prompts": 40}, "calibration": {"n_prompts": 100},
                                   "test": {"n_prompts": PROMPTS}},
                        identity.KEY: identity.stamp("budget_choice", choice, tau=TAU, procedure="bootstrap",
                                                     frontier=identity.file_digest(frontier))})
    table = root / "results" / "x" / "settings.tsv"
    table.write_text("key\tvalue\torigin\nexperiment\tx\tconfig\n")
    return frontier, choice, table


def draw(tmp_path, frontier, choice, table):
    return main(["figure", "--kind", "frontier", "--frontier", str(frontier), "--choice", str(choice),
                 "--experiment-settings", str(table), "--rule", "figure_frontier",
                 "--png", str(tmp_path / "f.png"), "--pdf", str(tmp_path / "f.pdf"),
                 "--provenance", str(tmp_path / "f.provenance.json")])


def test_the_frontier_is_drawn_with_its_budgets_and_choices(tmp_path):
    frontier, choice, table = write_inputs(tmp_path)
    assert draw(tmp_path, frontier, choice, table) in (0, None)
    for ext in ("png", "pdf", "provenance.json"):
        assert (tmp_path / f"f.{ext}").stat().st_size > 0
    side = json.loads((tmp_path / "f.provenance.json").read_text())
    assert side["rule"] == "figure_frontier" and side["params"]["kind"] == "frontier"
    assert set(side["inputs"]) == {str(frontier), str(choice), str(table)}
    shows = side["shows"]
    assert shows["kind"] == "frontier" and shows["tau"] == TAU and shows["test_prompts"] == PROMPTS
    assert shows["n"] == N and shows["pruned"] == len(PRUNED) and shows["procedure"] == "bootstrap"
    assert [(b["budget"], b["chosen"]) for b in shows["budgets"]] == [(0.25, "best_of_k:2"), (0.5, "best_of_k:4")]
    assert all(b["verdict"] == VERDICTS[0] for b in shows["budgets"])
    # Best-of-3 (upper bound above tau) and the second schedule are drawn hollow: their verdict is not met
    assert shows["not_met"] == ["best_of_k:3", "pruned:2@2,1@4"]


def _drop_reward(frontier, choice):
    pd.read_csv(frontier).drop(columns="mean_reward").to_csv(frontier, index=False)
    return "missing column(s) mean_reward"


def _edit_verdict(frontier, choice):
    df = pd.read_csv(frontier, keep_default_na=False)
    df.loc[df["name"] == "best_of_k:3", "verdict"] = VERDICTS[0]
    df.to_csv(frontier, index=False)
    return "best_of_k:3's verdict"


def _choose_elsewhere(frontier, choice):
    df = pd.read_csv(frontier, keep_default_na=False)
    df[df["name"] != "best_of_k:4"].to_csv(frontier, index=False)
    return "made beside the frontier table"


def _edit_a_number(frontier, choice):
    """A number the frontier's own checks cannot see (the chosen decoder's lambda*, its tokens): the choice names the
    digest of the table written beside it."""
    df = pd.read_csv(frontier, keep_default_na=False)
    df.loc[df["name"] == "best_of_k:2", "lambda_star"] = 4.99
    df.to_csv(frontier, index=False)
    return "made beside the frontier table"


@pytest.mark.parametrize("spoil", [_drop_reward, _edit_verdict, _choose_elsewhere, _edit_a_number])
def test_a_frontier_that_does_not_hold_is_refused_and_nothing_is_written(tmp_path, capsys, spoil):
    frontier, choice, table = write_inputs(tmp_path)
    said = spoil(frontier, choice)
    assert draw(tmp_path, frontier, choice, table) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "lara figure failed:" in last and said in last and str(frontier) in last
    assert not list(tmp_path.glob("f.*"))
