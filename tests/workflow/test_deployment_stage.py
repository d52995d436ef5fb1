"""Lambda after deployment on the shared toy run: every scenario's stream, its arms and their certificates.

The numbers are the toy run's own; what is asserted holds for any run: the identity of the online update to
rounding, the certificate above every window's mean, the oracle meeting tau with no reward given up, the online
arms holding tau up to their certificate's slack, and the report covering every scenario and arm."""

import json

import numpy as np
import pandas as pd
import pytest
import yaml

pytestmark = pytest.mark.workflow


def test_every_scenario_has_its_stream_arms_and_online_records(toy_run):
    res = toy_run / "results/tiny"
    config = yaml.safe_load((toy_run / "config/config.yaml").read_text())["deployment"]
    report = pd.read_csv(res / "deployment/report.csv")
    scenarios = [s["name"] for s in config["scenarios"]]
    assert sorted(report.scenario.unique()) == sorted(scenarios)
    lam = json.loads((res / "calibration/lambda.json").read_text())
    tau = lam["tau"]
    etas = config["step_size"]
    for scenario in scenarios:
        rows = report[report.scenario == scenario].set_index("arm")
        online = [f"online_eta_{str(e).replace('.', 'p')}" for e in etas]
        assert set(rows.index) >= {"fixed_star", "oracle", *online}
        assert rows.loc["fixed_star", "lambda_start"] == lam["lambda_star"]
        stream = pd.read_parquet(res / f"deployment/{scenario}/stream.parquet")
        assert stream.t.nunique() == config["stream_length"] and len(stream) == config["stream_length"] * 20
        if rows.loc["oracle", "feasible"]:
            assert rows.loc["oracle", "mean_cost"] <= tau and abs(rows.loc["oracle", "reward_given_up"]) < 1e-12
            met = rows[rows.met & ~rows.index.str.startswith("online")]
            assert np.all(met.reward_given_up >= -1e-12)  # no fixed lambda meeting tau beats the oracle
        for eta, arm in zip(etas, online, strict=True):
            record = json.loads((res / f"deployment/{scenario}/online_{str(eta).replace('.', 'p')}.json").read_text())
            assert record["identity_residual"] < 1e-12 and record["identity"]["scenario"] == scenario
            row = rows.loc[arm]
            assert row.worst_window_cost <= row.certificate + 1e-12
            slack = (row.lambda_end - row.lambda_start) / (eta * row["T"])
            assert row.mean_cost <= tau + slack + 1e-9
            visits = pd.read_parquet(res / f"deployment/{scenario}/online_{str(eta).replace('.', 'p')}.parquet")
            assert visits["lambda"].iloc[0] == lam["lambda_star"]
            assert np.all(visits.certificate >= visits.mean_cost - 1e-12)


def test_the_deployment_pool_is_disjoint_from_the_calibration_prompts_and_has_the_held_out_topic(toy_run):
    res = toy_run / "results/tiny"
    pool = pd.read_parquet(res / "data/prompts_deployment.parquet")
    calibration = pd.read_parquet(res / "data/prompts_calibration.parquet")
    test = pd.read_parquet(res / "data/prompts_test.parquet")
    assert set(pool.prompt).isdisjoint(calibration.prompt) and set(pool.prompt).isdisjoint(test.prompt)
    assert set(pool.stratum) == {"benign", "harmful", "held_out"}
    held = pool[pool.stratum == "held_out"].prompt
    assert not any(p in set(calibration.prompt) | set(test.prompt) for p in held)


def test_each_scenario_has_its_shift_check_and_a_weighted_lambda_certified_only_above_min_ess(toy_run):
    from lara.calibrate.record import read_lambda
    from lara.data.errors import DataError

    res = toy_run / "results/tiny"
    report = pd.read_csv(res / "deployment/report.csv")
    for scenario, rows in report.groupby("scenario"):
        shift = json.loads((res / f"deployment/{scenario}/shift.json").read_text())
        assert shift["scenario"] == scenario and 0.0 <= shift["auc"] <= 1.0 and 0.0 < shift["p_value"] <= 1.0
        assert rows.auc.nunique() == 1 and rows.auc.iloc[0] == shift["auc"]
        assert shift["shifted"] == (shift["p_value"] <= shift["alpha"])
        path = res / f"deployment/{scenario}/lambda_weighted.json"
        weighted = json.loads(path.read_text())
        assert weighted["certified"] == (weighted["weights"]["ess"] >= weighted["weights"]["min_ess"])
        if weighted["certified"]:
            assert "fixed_weighted" in set(rows.arm) and read_lambda(path).lambda_star == weighted["lambda_star"]
        else:  # below min_ess: reported, never deployed
            assert "fixed_weighted" not in set(rows.arm)
            with pytest.raises(DataError, match="min_ess"):
                read_lambda(path)
