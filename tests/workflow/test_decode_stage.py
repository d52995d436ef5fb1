"""The toy DAG's decoding outputs, and which jobs a change of tau invalidates."""

import re

import pandas as pd
import pytest

from ..conftest import run_snakemake

pytestmark = pytest.mark.workflow


def test_bon_sweep_trades_reward_for_cost(toy_run):
    sweep = pd.read_csv(toy_run / "results" / "tiny" / "decode" / "bon" / "sweep.csv")
    assert sorted(sweep["n"].unique()) == [4, 8, 20]  # decode.sweep_n and bon_n
    for n, rows in sweep.groupby("n"):
        grid = rows[rows["label"] == "grid"].sort_values("lambda")
        # every N has the 9 grid lambdas of the toy config and its own calibrated lambda-hat, lambda* and certified
        # CRC and LTT lambdas; the decoder's N also the lambda* of soft mode at each beta of calibration.soft_betas;
        # and every procedure's lambda of the same N calibrated as Best-of-k through the calibration core
        soft = ["soft_beta=0.1", "soft_beta=1", "soft_beta=10"] if n == 20 else []
        core = [f"core:{p}" for p in ("hat", "bootstrap", "crc", "ltt", "ltt_wsr")]
        expected = ["grid"] * 9 + ["lambda_hat", "lambda_star", "crc", "ltt", "ltt_wsr"] + soft + core
        assert len(grid) == 9 and sorted(rows["label"]) == sorted(expected), n
        # exact expectations over fixed candidates: both fall monotonically with lambda
        assert (grid["mean_cost"].diff().dropna() <= 1e-9).all() and (grid["mean_reward"].diff().dropna() <= 1e-9).all()
        assert grid["safe_fraction"].iloc[-1] > grid["safe_fraction"].iloc[0]
    main = sweep[(sweep["n"] == 20) & (sweep["label"] == "grid")].sort_values("lambda")
    assert main["mean_cost"].iloc[-1] < main["mean_cost"].iloc[0] - 1.0


def test_every_method_and_setting_decoded(toy_run):
    dec = toy_run / "results" / "tiny" / "decode"
    for method in ("bon", "args", "pargs", "cdq"):
        for lam in ("zero", "star", "max"):
            df = pd.read_parquet(dec / method / lam / "responses.parquet")
            assert len(df) == 256 and df["prompt_id"].is_unique
            assert (df["method"] == method).all() and (df["setting"] == lam).all()
            assert df["response"].str.len().gt(0).mean() > 0.9
    bon = {lam: pd.read_parquet(dec / "bon" / lam / "responses.parquet") for lam in ("zero", "max")}
    assert bon["max"]["cost"].mean() < bon["zero"]["cost"].mean()


def jobs(out: str) -> dict:
    table = out[out.index("Job stats"):]
    return {k: int(v) for k, v in re.findall(r"^(\w+)\s+(\d+)$", table, flags=re.M)}


def test_changing_tau_reruns_only_calibration_and_the_calibrated_branches(toy_run, tmp_path):
    (tmp_path / "tau.yaml").write_text("calibration:\n  tau: -0.25\n")
    proc = run_snakemake(toy_run, "-n", "--configfile", "config/config.yaml", str(tmp_path / "tau.yaml"))
    counts = jobs(proc.stdout)
    assert counts.get("calibrate_lambda") == 1
    # lambda-hat and lambda* come from lambda.json: the hat and star settings of every decoder (and Best-of-N's
    # certified crc, ltt and ltt_wsr settings); the coverage study is calibrated for tau too
    assert counts.get("coverage") == 1 and counts.get("select_bon") == 5
    assert counts.get("decode_rgtg") == 6 and counts.get("bon_sweep") == 1
    assert not {"train_sft", "train_reward_model", "train_cost_model", "train_safedpo", "sample", "score"} & set(counts)
    # Safe-RLHF's budget is tau: the one baseline held to it retrains and is sampled again, nothing else
    assert counts.get("train_safe_rlhf") == 1 and counts.get("generate_policy") == 1
    outputs = {o.strip() for line in re.findall(r"^\s+output: (.*)$", proc.stdout, flags=re.M)
               for o in line.split(",")}
    for method in ("bon", "args", "pargs", "cdq"):
        assert f"results/tiny/decode/{method}/star/responses.parquet" in outputs
        assert f"results/tiny/decode/{method}/hat/responses.parquet" in outputs
        assert f"results/tiny/decode/{method}/zero/responses.parquet" not in outputs
        assert f"results/tiny/decode/{method}/max/responses.parquet" not in outputs
    assert "results/tiny/decode/safe_rlhf/responses.parquet" in outputs
    assert "results/tiny/decode/safedpo/responses.parquet" not in outputs


def test_a_second_tau_reuses_every_model_sample_and_score(toy_run, tmp_path):
    """Listing one more tau on a finished run: its calibration from the same scores, its lambda* decodes, their
    evaluation, the audit and the figures, and nothing upstream: no training, sampling or scoring, and the
    main tau's calibration and decodes (and Safe-RLHF, whose budget is the main tau) stay as they are."""
    (tmp_path / "taus.yaml").write_text("calibration:\n  tau: [-0.5, -1.0]\n")
    proc = run_snakemake(toy_run, "-n", "--configfile", "config/config.yaml", str(tmp_path / "taus.yaml"))
    counts = jobs(proc.stdout)
    counts.pop("all", None)
    counts.pop("total", None)
    assert counts == {"calibrate_lambda_tau": 1, "select_bon": 1, "decode_rgtg": 3, "evaluate_decoded": 4,
                      "judge_decoded": 4, "bon_sweep": 1, "aggregate": 1, "experiment_settings": 1,
                      "figure_lambda_sweep": 1, "figure_tradeoff": 1, "figure_decoders": 1, "figure_taus": 1,
                      "figure_calibration": 1, "figure_coverage": 1, "figure_deployment": 1,
                      "figure_constraints": 1, "figure_constraints_sweep": 1, "figure_frontier": 1}, counts
    # every figure records the settings table, which changes; the coverage study stays (it is calibrated for the
    # main tau), and so does the deployment stage (held to the main tau)
    outputs = {o.strip() for line in re.findall(r"^\s+output: (.*)$", proc.stdout, flags=re.M)
               for o in line.split(",")}
    assert "results/tiny/calibration/tau_m1/lambda.json" in outputs
    for method in ("bon", "args", "pargs", "cdq"):
        assert f"results/tiny/decode/{method}/star_tau_m1/responses.parquet" in outputs
        assert f"results/tiny/decode/{method}/star/responses.parquet" not in outputs


def test_direct_calibration_of_the_token_level_decoders_adds_their_own_lambda_and_nothing_upstream(toy_run, tmp_path):
    (tmp_path / "direct.yaml").write_text("calibration:\n  token_level: direct\n")
    proc = run_snakemake(toy_run, "-n", "--configfile", "config/config.yaml", str(tmp_path / "direct.yaml"))
    counts = jobs(proc.stdout)
    assert counts.get("calibrate_direct") == 3 and counts.get("decode_rgtg") == 3
    assert counts.get("evaluate_decoded") == 3 and counts.get("aggregate") == 1
    assert not {"train_sft", "train_reward_model", "train_cost_model", "train_partial_model", "train_value_model",
                "train_safe_rlhf", "train_safedpo", "sample", "score", "calibrate_lambda", "select_bon"} & set(counts)
    outputs = {o.strip() for line in re.findall(r"^\s+output: (.*)$", proc.stdout, flags=re.M)
               for o in line.split(",")}
    for method in ("args", "pargs", "cdq"):
        assert f"results/tiny/calibration/direct_{method}.json" in outputs
        assert f"results/tiny/decode/{method}/direct/responses.parquet" in outputs
    assert "results/tiny/decode/bon/direct/responses.parquet" not in outputs
