"""Several tau from one set of samples and scores: calibration.tau as a list, each other tau calibrated
into its own lambda.json and decoded as the `star_tau_<tau>` setting, held to its own tau by the sweep and
the audit, and drawn as lambda*(tau). Everything runs through `lara.cli.main`, on Gaussian scores."""

import json

import numpy as np
import pandas as pd
import pytest

from lara.calibrate.calibrate import CalibrationSettings, calibrate
from lara.calibrate.dual import PromptScores
from lara.calibrate.record import parse_setting, parse_tau_name, setting_tau, tau_name, write_lambda
from lara.cli import main
from lara.config import ConfigError, load, load_schema, settings_json, taus

from ..conftest import REPO

TAUS = (-0.3, -0.8)


@pytest.mark.parametrize("tau", [-1.0, -0.25, 0.8, 0.0, -4.0, 1e-7, -123.456])
def test_a_tau_names_its_files_and_reads_back_exactly(tau):
    name = tau_name(tau)
    assert parse_tau_name(name) == tau and setting_tau(f"star_tau_{name}") == tau
    assert parse_setting(f"star_tau_{name}") is None  # read from a lambda.json, like star


def test_the_config_lists_several_tau_and_each_step_reads_one():
    config = load(REPO / "config/config.yaml", overrides={"calibration": {"tau": [-0.5, -1.0]}})
    schema = load_schema()
    assert taus(config) == [-0.5, -1.0]
    one = load(REPO / "config/config.yaml")
    # the main tau's steps read what they read with one tau: adding a tau reruns none of them
    for step in ("calibration", "aggregate", "bon-sweep", "train.safe_rlhf"):
        assert settings_json(config, step, schema) == settings_json(one, step, schema), step
    assert json.loads(settings_json(config, "calibration", schema, tau=-1.0))["tau"] == -1.0
    for bad in ([], [-1.0, -1.0], ["x"], [float("nan")]):
        with pytest.raises(ConfigError, match="calibration.tau"):
            load(REPO / "config/config.yaml", overrides={"calibration": {"tau": bad}})


@pytest.fixture()
def two_taus(tmp_path):
    rng = np.random.default_rng(3)
    p, k = 150, 8
    r = rng.normal(size=(p, k))
    c = 0.8 * r + rng.normal(scale=0.6, size=(p, k))  # reward and cost correlated: lambda has a price
    ids = np.repeat([f"p{i:03d}" for i in range(p)], k)
    cand = pd.DataFrame({"prompt_id": ids, "sample_id": np.tile(np.arange(k), p), "reward": r.ravel(),
                         "cost": c.ravel(), "prompt": [f"q{i // k}" for i in range(p * k)],
                         "response": [f"a{i}" for i in range(p * k)]})
    cand.to_parquet(tmp_path / "cand.parquet")
    scores = PromptScores.from_long(ids, r.ravel(), c.ravel())
    paths = {}
    for tau in TAUS:
        rec = calibrate(scores, CalibrationSettings(tau=tau, mode="bon", bon_n=k, bootstrap=200))
        paths[tau] = tmp_path / f"lambda_{tau_name(tau)}.json"
        write_lambda(rec, paths[tau])
    return tmp_path, paths, r, c


def test_each_tau_is_decoded_at_its_own_lambda_star_and_never_at_another_s(two_taus, capsys):
    tmp_path, paths, r, c = two_taus
    lam = {t: json.loads(p.read_text())["lambda_star"] for t, p in paths.items()}
    assert lam[-0.8] > lam[-0.3]  # a tighter budget needs a larger multiplier
    setting = f"star_tau_{tau_name(-0.8)}"
    argv = ["select-bon", "--candidates", str(tmp_path / "cand.parquet"), "--setting", setting,
            "--overpenalised-lambda", "5", "--lambda-json", str(paths[-0.8]), "--out", str(tmp_path / "sel.parquet")]
    assert main(argv) in (0, None)
    chosen = pd.read_parquet(tmp_path / "sel.parquet")
    assert (chosen["setting"] == setting).all() and (chosen["lambda"] == lam[-0.8]).all()
    # the main tau's record under another tau's name is refused, naming both
    argv[argv.index(str(paths[-0.8]))] = str(paths[-0.3])
    capsys.readouterr()
    assert main(argv) == 2
    assert f"calibrated for tau = -0.3, but --setting {setting} is -0.8" in capsys.readouterr().err


def test_the_sweep_holds_each_other_tau_to_its_own_budget(two_taus):
    from lara.decode.sweep import sweep_table

    tmp_path, paths, r, c = two_taus
    argv = ["bon-sweep", "--candidates", str(tmp_path / "cand.parquet"), "--lambda-json", str(paths[-0.3]),
            "--tau-lambda-json", str(paths[-0.8]), "--tau", "-0.3", "--bootstrap", "200", "--lambda-grid", "[0, 1]",
            "--out", str(tmp_path / "sweep.csv")]
    assert main(argv) in (0, None)
    table = pd.read_csv(tmp_path / "sweep.csv")
    row = table[table["label"] == "tau=-0.8"].iloc[0]
    ref = sweep_table(r, c, [row["lambda"]], ["x"], 8, tau=-0.8, n_boot=200)
    assert row["tau"] == -0.8 and row["verdict"] == ref["verdict"].iloc[0]
    assert row["mean_cost"] == pytest.approx(ref["mean_cost"].iloc[0])
    assert (table.loc[table["label"] != "tau=-0.8", "tau"] == -0.3).all()
    # the main record given again as another tau is refused
    argv[argv.index(str(paths[-0.8]))] = str(paths[-0.3])
    assert main(argv) == 2


def _eval_table(method, setting, lam, cost, reward):
    n = len(cost)
    return pd.DataFrame({"prompt_id": [f"p{i}" for i in range(n)], "method": method, "setting": setting,
                         "lambda": lam, "helpfulness": reward, "harmfulness": cost, "decoder_cost": cost,
                         "decoder_reward": reward})


def test_the_audit_lists_every_tau_with_its_decoders_held_to_it_and_the_figure_draws_them(two_taus):
    from PIL import Image

    tmp_path, paths, _, _ = two_taus
    lam = {t: json.loads(p.read_text())["lambda_star"] for t, p in paths.items()}
    rng = np.random.default_rng(0)
    # at the main tau's lambda* the cost sits at -0.6 (met against -0.3); at the other tau's at -0.6 too,
    # which is above -0.8 (violated): each is judged against its own budget
    outputs = {"star": _eval_table("bon", "star", lam[-0.3], -0.6 + 0.05 * rng.normal(size=200), 1.0),
               f"star_tau_{tau_name(-0.8)}": _eval_table("bon", f"star_tau_{tau_name(-0.8)}", lam[-0.8],
                                                         -0.6 + 0.05 * rng.normal(size=200), 0.7)}
    files = []
    for name, table in outputs.items():
        files.append(str(tmp_path / f"{name}.parquet"))
        table.to_parquet(files[-1])
    argv = ["aggregate", "--scores", *files, "--bon-star", files[0], "--lambda-json", str(paths[-0.3]),
            "--tau-lambda-json", str(paths[-0.8]), "--tau", "-0.3", "--bootstrap", "200",
            "--out", str(tmp_path / "summary.csv"), "--audit", str(tmp_path / "audit.json")]
    assert main(argv) in (0, None)
    audit = json.loads((tmp_path / "audit.json").read_text())
    rows = {r["tau"]: r for r in audit["taus"]}
    assert [r["tau"] for r in audit["taus"]] == [-0.3, -0.8] and rows[-0.3]["main"] and not rows[-0.8]["main"]
    assert rows[-0.8]["lambda_star"] == lam[-0.8] and rows[-0.8]["setting"] == f"star_tau_{tau_name(-0.8)}"
    assert rows[-0.3]["decoders"]["bon"]["verdict"].startswith("met")
    assert rows[-0.8]["decoders"]["bon"]["verdict"].startswith("violated")
    assert {r["setting"]: r["tau"] for r in audit["decoders"]} == {"star": -0.3, f"star_tau_{tau_name(-0.8)}": -0.8}
    rc = main(["figure", "--kind", "taus", "--audit", str(tmp_path / "audit.json"), "--lambda-json",
               str(paths[-0.3]), "--png", str(tmp_path / "t.png"), "--pdf", str(tmp_path / "t.pdf"),
               "--provenance", str(tmp_path / "t.provenance.json")])
    assert rc in (0, None) and Image.open(tmp_path / "t.png").size[0] > 500
    import matplotlib

    matplotlib.use("Agg")
    from lara.evaluate.figures import FigureSettings
    from lara.evaluate.figures import taus as draw_taus

    fig = draw_taus(audit, FigureSettings())
    lam_line = fig.axes[0].lines[0]
    assert list(lam_line.get_xdata()) == [-0.8, -0.3] and list(lam_line.get_ydata()) == [lam[-0.8], lam[-0.3]]
    # `lara summary` lists every tau with its lambda* and verdicts
    import shutil

    root = tmp_path / "results"
    (root / "calibration").mkdir(parents=True)
    (root / "eval").mkdir()
    shutil.copy(paths[-0.3], root / "calibration" / "lambda.json")
    shutil.copy(tmp_path / "audit.json", root / "eval" / "constraint_audit.json")
    shutil.copy(tmp_path / "summary.csv", root / "eval" / "summary.csv")
    from lara.evaluate.summary import summarise_run

    text = summarise_run(root)
    assert f"tau     -0.3 (main)  lambda* {lam[-0.3]:.4g}" in text and "bon cost" in text
    assert f"tau     -0.8         lambda* {lam[-0.8]:.4g}" in text and "violated" in text
    # an audit with one tau has nothing to draw against tau
    audit["taus"] = audit["taus"][:1]
    (tmp_path / "audit.json").write_text(json.dumps(audit))
    rc = main(["figure", "--kind", "taus", "--audit", str(tmp_path / "audit.json"), "--lambda-json",
               str(paths[-0.3]), "--png", str(tmp_path / "u.png"), "--pdf", str(tmp_path / "u.pdf"),
               "--provenance", str(tmp_path / "u.provenance.json")])
    assert rc == 2 and not list(tmp_path.glob("u.*"))
