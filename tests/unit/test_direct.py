"""calibration.token_level: direct — the search that calibrates lambda for a token-level decoder itself
(lara.decode.direct), on synthetic cost curves, and `lara calibrate-decoder` end to end on tiny models."""

import json

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.record import read_direct
from lara.decode.direct import search


def _curve(fn):
    calls = []

    def evaluate(lam):
        calls.append(lam)
        return {"mean_cost": float(fn(lam))}

    return evaluate, calls


@pytest.mark.parametrize("crossing", [0.013, 0.07, 0.3, 1.7])
def test_a_monotone_cost_is_met_within_the_final_bracket_of_its_crossing(crossing):
    evaluate, calls = _curve(lambda lam: crossing - lam)  # meets tau = 0 exactly from the crossing on
    grid = [0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0]
    out = search(evaluate, grid, 0.0, refine_steps=5)
    lo, hi = out["bracket"]
    assert out["status"] == "feasible" and out["lambda_star"] == hi
    assert lo < crossing <= hi and hi - lo <= (max(grid) / 2 ** 5)  # the bracket halves five times
    assert crossing - hi <= 0  # the deployed lambda meets tau
    assert out["n_decodes"] == len(calls) == len(set(calls))  # each lambda decoded once
    # every grid lambda below the bracket was measured, and above tau
    assert all(e["mean_cost"] > 0 for e in out["evaluations"] if e["lambda"] < hi)


def test_a_non_monotone_cost_never_deploys_a_lambda_that_was_not_measured_to_meet_tau():
    rng = np.random.default_rng(1)
    for _ in range(200):
        bumps = rng.normal(scale=0.3, size=4)

        def cost(lam, bumps=bumps):
            return 0.5 - lam + 0.2 * np.sin(7 * lam + bumps[0]) + bumps[1] * (lam > bumps[2] ** 2)

        evaluate, _ = _curve(cost)
        out = search(evaluate, [0.1, 0.25, 0.5, 1.0, 2.0], 0.0, refine_steps=3)
        measured = {e["lambda"]: e["mean_cost"] for e in out["evaluations"]}
        if out["status"] == "infeasible":
            assert all(v > 0 for v in measured.values()) and out["lambda_star"] == 2.0
            continue
        assert measured[out["lambda_star"]] <= 0  # deployed only where its own decode met tau
        lo = out["bracket"][0]
        assert lo is None or measured[lo] > 0  # the bracket's left end was measured above tau
        assert all(measured[g] > 0 for g in (0.0, 0.1, 0.25, 0.5, 1.0, 2.0) if g in measured and g < (lo or 0))


def test_zero_that_meets_tau_is_deployed_after_one_decode_and_no_grid_lambda_is_infeasible():
    evaluate, calls = _curve(lambda lam: -1.0)
    out = search(evaluate, [0.5, 1.0], 0.0, 4)
    assert (out["status"], out["lambda_star"], calls) == ("unconstrained", 0.0, [0.0])
    evaluate, calls = _curve(lambda lam: 1.0)
    out = search(evaluate, [0.5, 1.0], 0.0, 4)
    assert (out["status"], out["lambda_star"], calls) == ("infeasible", 1.0, [0.0, 0.5, 1.0])


def test_a_record_of_another_kind_or_with_a_bad_lambda_is_refused(tmp_path):
    from lara.read.files import DataError

    (tmp_path / "a.json").write_text(json.dumps({"kind": "token_level_direct", "lambda_star": float("nan"),
                                                 "tau": -0.5}))
    with pytest.raises(DataError, match="lambda_star: not a finite number"):
        read_direct(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({"lambda_star": 0.1, "tau": -0.5, "mode": "bon"}))
    with pytest.raises(DataError, match="not a `lara calibrate-decoder` record"):
        read_direct(tmp_path / "b.json")


def test_calibrate_decoder_end_to_end_and_the_decoder_deploys_its_lambda(ppo_inputs, tiny_world, tmp_path):
    """Tiny models (random reward and cost heads): tau far above every cost deploys lambda = 0 after one decode;
    tau far below is infeasible after scanning the grid; `lara rgtg --setting direct` decodes at the record's
    lambda."""
    from lara.cli import main

    prompts = pd.DataFrame({"prompt_id": [f"c{i}" for i in range(6)],
                            "prompt": [p["prompt"] for p in tiny_world["world"]["prompts"][:6]]})
    _prompts(prompts, tmp_path / "prompts.parquet", "calibration")
    decoder = json.dumps({"top_k": 4, "weight": 2.0, "temperature": 0.0, "max_new_tokens": 6, "seed": 0,
                          "dtype": "float32"})
    models = ["--policy", str(tiny_world["base"]), "--reward", str(ppo_inputs / "reward"), "--cost",
              str(ppo_inputs / "cost"), "--decoder-reward", str(ppo_inputs / "reward"), "--decoder-cost",
              str(ppo_inputs / "cost")]
    for tau, status, decodes in ((1e6, "unconstrained", 1), (-1e6, "infeasible", 3)):
        out = tmp_path / f"direct_{status}.json"
        rc = main(["calibrate-decoder", "--method", "args", *models, "--prompts", str(tmp_path / "prompts.parquet"),
                   "--decoder-settings", decoder, "--settings", json.dumps({
                       "tau": tau, "lambda_grid": [0.5, 2.0], "refine_steps": 2, "bootstrap": 50, "seed": 0}),
                   "--out", str(out)])
        assert rc in (0, None)
        rec = read_direct(out)
        assert (rec["status"], rec["n_decodes"], rec["n_prompts"]) == (status, decodes, 6)
        made = rec["identity"]  # what later steps check (its calibration prompts, for an in-sample audit)
        assert (made["kind"], made["role"], made["prompts"]["n"], made["tau"]) == ("token_level_direct",
                                                                                  "calibration", 6, tau)
        assert list(made["made_from"]) == ["--prompts"]
        assert all(np.isfinite(e["mean_cost"]) and len(e["ci95"]) == 2 for e in rec["evaluations"])
    rc = main(["rgtg", "--method", "args", "--policy", str(tiny_world["base"]), "--reward", str(ppo_inputs / "reward"),
               "--cost", str(ppo_inputs / "cost"), "--prompts", str(tmp_path / "prompts.parquet"), "--setting",
               "direct", "--overpenalised-lambda", "5", "--lambda-json", str(tmp_path / "direct_infeasible.json"),
               "--settings", decoder, "--out", str(tmp_path / "dec.parquet")])
    assert rc in (0, None)
    dec = pd.read_parquet(tmp_path / "dec.parquet")
    assert (dec["setting"] == "direct").all() and (dec["lambda"] == 2.0).all()


def _prompts(df, path, role):
    """A prompt table as lara prepare-data writes it: its identity states its role."""
    from lara import identity
    from lara.read.files import write_table

    write_table(df, path, {identity.KEY: identity.stamp("prompts", path, role=role)})
    return path


def test_calibrate_decoder_refuses_prompts_of_another_role_before_decoding(tmp_path, capsys):
    """The test prompts (role test) are the audit's: a lambda calibrated on them makes the audit in-sample. Refused
    before any model is loaded (the models here do not exist)."""
    from lara.cli import main

    prompts = _prompts(pd.DataFrame({"prompt_id": ["t0", "t1"], "prompt": ["a", "b"]}), tmp_path / "test.parquet",
                       "test")
    models = [x for flag in ("--policy", "--reward", "--cost", "--decoder-reward", "--decoder-cost")
              for x in (flag, str(tmp_path / "no_model"))]
    rc = main(["calibrate-decoder", "--method", "args", *models, "--prompts", str(prompts), "--decoder-settings",
               json.dumps({"top_k": 4, "weight": 2.0, "temperature": 0.0, "max_new_tokens": 6, "seed": 0,
                           "dtype": "float32"}), "--settings", json.dumps({
                   "tau": 0.0, "lambda_grid": [0.5], "refine_steps": 0, "bootstrap": 50, "seed": 0}),
               "--out", str(tmp_path / "direct.json")])
    assert rc == 2 and not (tmp_path / "direct.json").exists()
    assert "test.parquet: role test, expected calibration" in capsys.readouterr().err
