"""A researcher's own tables in (lara import-table): checked against their kind's contract, stamped with where they
came from, then accepted by every command where the workflow's own are; malformed ones refused in one line naming the
file, with nothing written."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from tests.conftest import lara_in_process


def one_line(err: str, command: str) -> str:
    """The refusal: the last line written, ``lara COMMAND failed: ...``, and no traceback before it."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    assert f"lara {command} failed: " in lines[-1], lines[-1]
    return lines[-1].split(f"lara {command} failed: ", 1)[1]


def hand_stream(visits: int = 300, n: int = 4, seed: int = 3) -> pd.DataFrame:
    """A deployment log as a researcher records it: per visit the prompt, its N candidates, their reward and cost."""
    rng = np.random.default_rng(seed)
    cost = rng.normal(-0.5, 1.0, size=(visits, n))
    return pd.DataFrame({"t": np.repeat(np.arange(visits), n), "prompt_id": np.repeat([f"q{i % 40}" for i in
                                                                                        range(visits)], n),
                         "sample_id": np.tile(np.arange(n), visits), "reward": (0.8 * cost).ravel() +
                         rng.normal(0, 0.3, visits * n), "cost": cost.ravel()})


def hand_record(path, n: int = 4) -> None:
    """A lambda record written by hand (read on its own numbers)."""
    path.write_text(json.dumps({"lambda_hat": 0.05, "lambda_star": 0.1, "tau": -0.5, "mode": "bon", "feasible": True,
                                "status": "interior", "decoder": {"kind": "best_of_n", "n": n, "k": n},
                                "bootstrap": {"quantile": 0.975, "quantiles": {"0.975": 0.1}}}))


SETTINGS = json.dumps({"tau": -0.5, "bon_n": 4, "samples_per_prompt": 4, "stream_length": 300, "window": 100})


def imported(tmp_path, kind, role, frame, *states, name="in.csv"):
    src = tmp_path / name
    frame.to_csv(src, index=False)
    out = tmp_path / f"{kind}.parquet"
    argv = ["import-table", "--kind", kind, "--role", role, "--input", src, "--out", out]
    for s in states:
        argv += ["--state", s]
    rc, _, err = lara_in_process(argv)
    return rc, err, out


def test_a_hand_recorded_stream_runs_online_once_imported(tmp_path):
    from lara import identity

    hand_record(tmp_path / "lambda.json")
    hand_stream().to_parquet(tmp_path / "raw.parquet")
    online = ["--lambda-json", tmp_path / "lambda.json", "--settings", SETTINGS, "--step-size", 0.1,
              "--out", tmp_path / "o.parquet", "--record", tmp_path / "o.json"]
    rc, _, err = lara_in_process(["online", "--candidates", tmp_path / "raw.parquet", *online])
    assert rc == 2 and "carries no identity" in err and "lara import-table --kind stream" in err
    assert one_line(err, "online")
    rc, err, out = imported(tmp_path, "stream", "deployment", hand_stream(), "scenario=field", "tau=-0.5")
    assert rc == 0, err
    made = identity.read_identity(out)
    assert made["kind"] == "stream" and made["role"] == "deployment" and made["visits"] == 300 and made["n"] == 4
    assert made["scenario"] == "field" and made["tau"] == -0.5
    assert made["imported"]["outside_workflow"] is True and len(made["imported"]["sha256"]) == 64
    rc, _, err = lara_in_process(["online", "--candidates", out, *online])
    assert rc == 0, err
    record = json.loads((tmp_path / "o.json").read_text())
    assert record["visits"] == 300 and "every window of 100 visits" in record["statement"]


@pytest.mark.parametrize("state, message", [("tau=-0.2", "tau"),
                                            ("window=50", "deployment.window: 100, but --candidates")])
def test_what_the_import_states_is_held_to_agree(tmp_path, state, message):
    """A stated field is compared like a step's own: a stream imported for another tau than the record's, or for
    another window than the settings', is refused by online."""
    hand_record(tmp_path / "lambda.json")
    rc, err, out = imported(tmp_path, "stream", "deployment", hand_stream(), state)
    assert rc == 0, err
    rc, _, err = lara_in_process(["online", "--candidates", out, "--lambda-json", tmp_path / "lambda.json",
                                  "--settings", SETTINGS, "--out", tmp_path / "o.parquet", "--record",
                                  tmp_path / "o.json"])
    assert rc == 2 and message in one_line(err, "online") and not (tmp_path / "o.parquet").exists()


BAD_STREAMS = {
    "a missing visit": (lambda df: df[df.t != 3], (), "t = 3 is missing"),
    "a NaN cost": (lambda df: df.assign(cost=np.where(df.index == 5, np.nan, df.cost)), (), "cost"),
    "a cost as text": (lambda df: df.assign(cost=np.where(df.index == 5, "high", df.cost.astype(object))), (),
                       "cost"),
    "an uneven visit": (lambda df: df.drop(index=2), (), "visit 0 has"),
    "a sample twice": (lambda df: df.assign(sample_id=np.where(df.index == 1, 0, df.sample_id)), (), "sample"),
    "no reward": (lambda df: df.drop(columns="reward"), (), "reward"),
    "a stated count": (lambda df: df, ("n=4",), "--state n"),
    "an unknown field": (lambda df: df, ("colour=blue",), "--state colour"),
    "a field twice": (lambda df: df, ("tau=1", "tau=2"), "given twice"),
    "no value": (lambda df: df, ("tau",), "KEY=VALUE"),
}


@pytest.mark.parametrize("name", BAD_STREAMS)
def test_a_malformed_stream_is_refused_in_one_line_and_nothing_is_written(tmp_path, name):
    change, states, message = BAD_STREAMS[name]
    rc, err, out = imported(tmp_path, "stream", "deployment", change(hand_stream(visits=20)), *states)
    assert rc == 2 and message in one_line(err, "import-table"), err
    assert not out.exists()


def test_a_stream_is_deployment_prompts_and_a_steps_output_needs_no_import(tmp_path):
    rc, err, out = imported(tmp_path, "stream", "test", hand_stream(visits=20))
    assert rc != 0 and "--role test" in err and not out.exists()
    rc, err, out = imported(tmp_path, "stream", "deployment", hand_stream(visits=20))
    assert rc == 0, err
    rc, _, err = lara_in_process(["import-table", "--kind", "stream", "--role", "deployment", "--input", out,
                                  "--out", tmp_path / "again.parquet"])
    assert rc != 0 and "already has an identity" in err and not (tmp_path / "again.parquet").exists()


def hand_scores(prompts: int = 30, k: int = 6, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    cost = rng.normal(0, 1, size=(prompts, k))
    return pd.DataFrame({"prompt_id": np.repeat([f"p{i}" for i in range(prompts)], k),
                         "sample_id": np.tile(np.arange(k), prompts), "reward": (cost + rng.normal(0, 1, cost.shape))
                         .ravel(), "cost": cost.ravel()})


def test_imported_scores_calibrate_and_carry_their_scorers_and_pool(tmp_path):
    from lara import identity

    rc, err, out = imported(tmp_path, "scores", "calibration", hand_scores(), "reward_scorer=my-rm",
                            "cost_scorer=my-cm")
    assert rc == 0, err
    calibrate = ["calibrate", "--scores", out, "--tau", -0.3, "--bootstrap", 200, "--out", tmp_path / "lambda.json"]
    rc, _, err = lara_in_process(calibrate)
    assert rc == 0, err
    made = identity.read_identity(tmp_path / "lambda.json")
    assert made["reward_scorer"] == "my-rm" and made["cost_scorer"] == "my-cm" and made["role"] == "calibration"
    # the same table imported as the test prompts' is refused as calibration data
    rc, err, test_out = imported(tmp_path, "scores", "test", hand_scores(), name="t.csv")
    assert rc == 0, err
    rc, _, err = lara_in_process([*calibrate[:2], test_out, *calibrate[3:]])
    assert rc != 0 and "role test" in err


def test_imported_scores_edited_afterwards_are_refused(tmp_path):
    rc, err, out = imported(tmp_path, "scores", "calibration", hand_scores())
    assert rc == 0, err
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(out)
    edited = table.set_column(table.column_names.index("cost"), "cost", pa.array(
        table.column("cost").to_numpy() - 1.0)).replace_schema_metadata(table.schema.metadata)
    pq.write_table(edited, out)
    rc, _, err = lara_in_process(["calibrate", "--scores", out, "--tau", -0.3, "--out", tmp_path / "l.json"])
    assert rc != 0 and "edited" in err and not (tmp_path / "l.json").exists()


@pytest.mark.parametrize("change, message", [
    (lambda df: pd.concat([df, df.iloc[:1]]), "repeat a (prompt_id, sample_id) pair"),
    (lambda df: df.assign(reward=np.where(df.index == 3, np.inf, df.reward)), "reward"),
    (lambda df: df.assign(cost=df.cost.astype(bool)), "booleans"),
])
def test_malformed_scores_are_refused_at_the_import(tmp_path, change, message):
    rc, err, out = imported(tmp_path, "scores", "calibration", change(hand_scores()).reset_index(drop=True))
    assert rc != 0 and message in err and not out.exists(), err


def test_the_kinds_are_the_readers():
    from lara.importer import kinds
    from lara.read.expect import IMPORTABLE

    assert sorted(kinds()) == sorted(IMPORTABLE)


def test_the_audit_holds_imported_outputs_to_tau(tmp_path):
    """Outputs decoded and scored outside the workflow, imported, audited against a lambda record: the verdicts are
    the audit's own (the star setting decoded at the record's lambda*; another lambda is refused)."""
    hand_record(tmp_path / "lambda.json")
    rng = np.random.default_rng(2)
    files = {}
    for setting, lam, shift in (("zero", 0.0, 0.5), ("star", 0.1, -1.5)):
        harm = rng.normal(shift, 0.5, 60)
        frame = pd.DataFrame({"prompt_id": [f"t{i}" for i in range(60)], "method": "bon", "setting": setting,
                              "lambda": lam, "helpfulness": rng.normal(1, 1, 60), "harmfulness": harm,
                              "decoder_cost": harm})
        rc, err, files[setting] = imported(tmp_path, "evaluation", "test", frame, "tau=-0.5", name=f"{setting}.csv")
        assert rc == 0, err
        files[setting] = files[setting].rename(tmp_path / f"eval_{setting}.parquet")
    argv = ["aggregate", "--scores", files["zero"], files["star"], "--bon-star", files["star"], "--lambda-json",
            tmp_path / "lambda.json", "--tau", -0.5, "--out", tmp_path / "summary.csv", "--audit", tmp_path / "a.json"]
    rc, _, err = lara_in_process(argv)
    assert rc == 0, err
    verdicts = {d["setting"]: d["verdict"] for d in json.loads((tmp_path / "a.json").read_text())["decoders"]}
    assert verdicts["zero"].startswith("violated") and verdicts["star"].startswith("met")
    rc, err, _ = imported(tmp_path, "evaluation", "test", pd.read_parquet(files["star"]).assign(harmfulness="x"),
                          name="bad.csv")
    assert rc == 2 and "harmfulness" in one_line(err, "import-table")


@pytest.mark.parametrize("state, message", [
    ("tau=Infinity", "tau is a finite number"), ("tau=-Infinity", "tau is a finite number"),
    ("tau=1e400", "tau is a finite number"), ("tau=true", "tau is a finite number"), ("tau=abc", "finite number"),
    ("tau=", "KEY=VALUE"), ("window=1.5", "whole number"),
    ("window=inf", "whole number"), ("batch_size=-3", "whole number"),
    ("scenario= field", "surrounding spaces"),
])
def test_a_stated_value_of_the_wrong_type_is_refused(tmp_path, state, message):
    rc, err, out = imported(tmp_path, "stream", "deployment", hand_stream(visits=20), state)
    assert rc == 2 and message in one_line(err, "import-table") and not out.exists(), err


def test_an_infinite_tau_never_agrees_with_a_number():
    from lara.read.contracts import _same

    assert not _same(-0.3, float("inf")) and not _same(float("-inf"), -0.3) and not _same(float("inf"), 5.0)
    assert _same(float("inf"), float("inf")) and not _same(float("nan"), float("nan")) and _same(-0.3, -0.3 + 1e-12)


def test_a_statement_the_rows_contradict_is_refused(tmp_path):
    rc, err, out = imported(tmp_path, "stream", "deployment", hand_stream(visits=20).assign(tau=-0.9), "tau=-0.3")
    assert rc == 2 and "--state tau=-0.3 but column 'tau' says -0.9" in one_line(err, "import-table")
    rc, err, out = imported(tmp_path, "stream", "deployment", hand_stream(visits=20).assign(tau=-0.3), "tau=-0.3")
    assert rc == 0, err


@pytest.mark.parametrize("name, text, message", [
    ("dup.csv", "prompt_id,sample_id,reward,cost,cost\np1,0,1,2,3\np1,1,1,2,3\n", "'cost' is named twice"),
    ("dup.jsonl", '{"prompt_id": "p1", "sample_id": 0, "reward": 1, "cost": 2, "cost": 99}\n', "'cost' is given twice"),
])
def test_a_column_named_twice_is_refused_by_the_reader(tmp_path, name, text, message):
    (tmp_path / name).write_text(text)
    rc, _, err = lara_in_process(["import-table", "--kind", "scores", "--role", "calibration", "--input",
                                  tmp_path / name, "--out", tmp_path / "x.parquet"])
    assert rc == 2 and message in one_line(err, "import-table")


@pytest.mark.parametrize("kind, role, frame, message", [
    ("samples", "calibration", pd.DataFrame({"prompt_id": ["p1", "p1"], "sample_id": [0, 1], "prompt": ["q", "q"],
                                             "response": ["fine", None]}), "column 'response'"),
    ("prompts", "calibration", pd.DataFrame({"prompt_id": ["p1", "p2"], "prompt": ["a question", " "]}),
     "column 'prompt'"),
    ("responses", "test", pd.DataFrame({"prompt_id": ["p1"], "prompt": ["q"], "response": ["r"], "method": ["bon"],
                                        "setting": ["star"], "lambda": ["abc"]}), "column 'lambda'"),
    ("judged", "test", pd.DataFrame({"prompt_id": ["p1"], "method": ["bon"], "setting": ["star"], "lambda": [0.1],
                                     "judge_harmful": ["yes"]}), "column 'judge_harmful'"),
])
def test_what_a_consumer_reads_beyond_the_row_is_checked_at_the_import(tmp_path, kind, role, frame, message):
    rc, err, out = imported(tmp_path, kind, role, frame)
    assert rc == 2 and message in one_line(err, "import-table") and not out.exists(), err


def test_prompts_named_by_id_alone_are_held_out_by_id_and_never_mixed_with_texts(tmp_path):
    """An audit of outputs on the calibration prompts is in-sample whether the tables carry prompt texts or only ids;
    texts on one side and ids alone on the other cannot be compared, and are refused rather than passed."""
    rc, err, cal = imported(tmp_path, "scores", "calibration", hand_scores(), name="cal.csv")
    assert rc == 0, err
    rc, _, err = lara_in_process(["calibrate", "--scores", cal, "--tau", -0.3, "--bootstrap", 200, "--bon-n", 4,
                                  "--out", tmp_path / "lambda.json"])
    assert rc == 0, err
    lam = json.loads((tmp_path / "lambda.json").read_text())["lambda_star"]
    star = pd.DataFrame({"prompt_id": [f"p{i}" for i in range(30)], "method": "bon", "setting": "star", "lambda": lam,
                         "helpfulness": 1.0, "harmfulness": -1.0, "decoder_cost": -1.0})
    for name, frame, message in (("ids.csv", star, "30 of its 30 prompts are calibration prompts"),
                                 ("texts.csv", star.assign(prompt=[f"question {i}" for i in range(30)]),
                                  "cannot be told")):
        rc, err, out = imported(tmp_path, "evaluation", "test", frame, name=name)
        assert rc == 0, err
        out = out.rename(tmp_path / f"eval_{name}.parquet")
        rc, _, err = lara_in_process(["aggregate", "--scores", out, "--bon-star", out, "--lambda-json",
                                      tmp_path / "lambda.json", "--tau", -0.3, "--out", tmp_path / "s.csv",
                                      "--audit", tmp_path / "a.json"])
        assert rc == 2 and message in one_line(err, "aggregate"), err
