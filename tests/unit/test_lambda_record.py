"""lambda.json: one writer (lara calibrate), one reader, and the named lambda settings."""

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.record import REQUIRED, read_lambda, resolve_lambda, write_lambda
from lara.read.files import DataError


@pytest.fixture()
def calibrated(tmp_path):
    """A lambda.json written by the real `lara calibrate` on 30 prompts x 4 samples."""
    rng = np.random.default_rng(0)
    r, c = rng.normal(size=(30, 4)), rng.normal(size=(30, 4)) + 0.3
    scores = tmp_path / "scores.parquet"
    pd.DataFrame({"prompt_id": np.repeat(np.arange(30), 4).astype(str), "sample_id": np.tile(np.arange(4), 30),
                  "reward": r.ravel(), "cost": c.ravel()}).to_parquet(scores)
    out = tmp_path / "lambda.json"
    subprocess.run([sys.executable, "-m", "lara", "calibrate", "--scores", str(scores), "--tau", "0", "--bootstrap",
                    "200", "--bon-n", "4", "--out", str(out)], check=True, capture_output=True)
    return out


def test_the_record_read_back_is_what_calibrate_wrote(calibrated, tmp_path):
    raw = json.loads(calibrated.read_text())
    rec = read_lambda(calibrated)
    assert (rec.lambda_hat, rec.lambda_star, rec.tau, rec.mode) == (raw["lambda_hat"], raw["lambda_star"], 0.0, "bon")
    assert rec.decoder_n == 4 and rec.bootstrap["replicates"] == 200 and rec.data == raw
    assert resolve_lambda("star", 5.0, calibrated) == raw["lambda_star"]
    assert resolve_lambda("hat", 5.0, calibrated) == raw["lambda_hat"]
    # a round trip through the writer keeps every key
    write_lambda(raw, tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == raw


@pytest.mark.parametrize("text, message", [
    ("not json", "not a readable lambda.json"),
    ("[1, 2]", "holds a JSON object"),
    ('{"lambda_star": 0.5}', "missing key(s) lambda_hat, tau, mode, decoder, feasible, status, bootstrap"),
])
def test_a_bad_lambda_json_names_the_file_and_key(tmp_path, text, message):
    path = tmp_path / "lambda.json"
    path.write_text(text)
    with pytest.raises(DataError, match=rf"{path}: .*{message.split('(')[0]}") as info:
        read_lambda(path)
    assert message in str(info.value)
    with pytest.raises(DataError, match="no such lambda.json"):
        read_lambda(tmp_path / "missing.json")


def test_negative_lambdas_and_incomplete_writes_are_refused(calibrated, tmp_path):
    raw = json.loads(calibrated.read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw | {"lambda_star": -0.1}))
    with pytest.raises(DataError, match="its content is not what its step wrote"):  # sealed: any edit is refused
        read_lambda(bad)
    bad.write_text(json.dumps({k: v for k, v in raw.items() if k != "identity"} | {"lambda_star": -0.1}))
    with pytest.raises(DataError, match="must be >= 0"):  # a record by hand is checked field by field
        read_lambda(bad)
    with pytest.raises(DataError, match="refusing to write a lambda.json without tau"):
        write_lambda({k: v for k, v in raw.items() if k != "tau"}, tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()
    assert set(REQUIRED) <= set(raw)


def test_a_number_s_file_name_reads_back_as_the_same_number():
    from lara.calibrate.record import literal_name, parse_setting

    for value, name in ((0.1, "0p1"), (10.0, "10"), (1.0, "1"), (1e-7, "0p0000001"), (0.0, "0"), (2.5, "2p5")):
        assert literal_name(value) == name and parse_setting(name) == value
    for value in (0.1 + 0.2, 1 / 3, 123456.789):
        assert parse_setting(literal_name(value)) == value
    for bad in (float("nan"), float("inf"), -1.0):
        with pytest.raises(ValueError, match="only a finite number >= 0 has a name"):
            literal_name(bad)


def test_named_settings():
    assert resolve_lambda("zero", 3.0) == 0.0 and resolve_lambda("max", 3.0) == 3.0
    assert resolve_lambda("1p5", 3.0) == 1.5
    with pytest.raises(ValueError, match="pass --lambda-json"):
        resolve_lambda("star", 3.0)
    with pytest.raises(ValueError, match="--setting hat: lambda-hat is read from lambda.json"):
        resolve_lambda("hat", 3.0)
    with pytest.raises(ValueError, match="is zero, hat, star, max, star_tau_<tau> .* or a literal"):
        resolve_lambda("half", 3.0)
