"""Evaluation, figures, report and the provenance audit on the finished toy run."""

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from lara.stats import VERDICTS

from ..conftest import run_snakemake
from .test_invalidation import dry_run, override

pytestmark = pytest.mark.workflow

FIGURES = ("lambda_sweep", "tradeoff", "calibration", "decoders")


def test_summary_covers_every_method_setting_and_policy(toy_run):
    s = pd.read_csv(toy_run / "results/tiny/eval/summary.csv")
    pairs = set(zip(s["method"], s["setting"], strict=True))
    for m in ("bon", "args", "pargs", "cdq"):
        assert {(m, "zero"), (m, "star"), (m, "max")} <= pairs
    assert {("sft", "policy"), ("safe_rlhf", "policy"), ("safedpo", "policy")} <= pairs
    assert (s["n"] == 256).all()
    for col in ("helpfulness", "harmfulness", "safe_rate", "judge_helpfulness", "judge_harmlessness"):
        assert (s[f"{col}_lo"] <= s[col] + 1e-12).all() and (s[col] <= s[f"{col}_hi"] + 1e-12).all(), col
    # lambda trades helpfulness for harmlessness: Best-of-N at the over-penalised lambda is less harmful than at 0
    bon = s[s["method"] == "bon"].set_index("setting")
    assert bon.loc["max", "harmfulness"] < bon.loc["zero", "harmfulness"]
    assert bon.loc["max", "judge_harmlessness"] > bon.loc["zero", "judge_harmlessness"]


def test_constraint_audit_is_reported(toy_run):
    audit = json.loads((toy_run / "results/tiny/eval/constraint_audit.json").read_text())
    lam = json.loads((toy_run / "results/tiny/calibration/lambda.json").read_text())
    star = pd.read_parquet(toy_run / "results/tiny/eval/bon/star/scores.parquet")
    assert audit["tau"] == -0.5 and audit["lambda_star"] == lam["lambda_star"]
    assert audit["mean_cost"] == pytest.approx(star["decoder_cost"].mean())
    assert audit["ci95"][0] <= audit["mean_cost"] <= audit["ci95"][1]
    assert audit["verdict"] in VERDICTS
    # the audit at every lambda of the sweep, for the decoder's N and each other N; not repeated in the summary
    sweep = pd.read_csv(toy_run / "results/tiny/decode/bon/sweep.csv")
    assert len(audit["by_lambda"]) == (sweep["n"] == 20).sum() and set(audit["by_n"]) == {"4", "8", "20"}
    for row in audit["by_lambda"]:
        assert row["ci95"][0] <= row["mean_cost"] <= row["ci95"][1]
    summary = pd.read_csv(toy_run / "results/tiny/eval/summary.csv")
    assert not [c for c in summary.columns if c.startswith("audit")]


def test_every_decoder_is_held_to_tau_in_its_units(toy_run):
    """Each decoder at each lambda setting is scored by the decoding reward and cost models (the
    calibration's, tau's units) and audited: mean cost, intervals and a verdict; lambda* is compared
    with the other settings on the same prompts."""
    audit = json.loads((toy_run / "results/tiny/eval/constraint_audit.json").read_text())
    rows = {(r["method"], r["setting"]): r for r in audit["decoders"]}
    for method in ("bon", "args", "pargs", "cdq"):
        for setting in ("zero", "hat", "star", "max"):
            row = rows[(method, setting)]
            scores = pd.read_parquet(toy_run / f"results/tiny/eval/{method}/{setting}/scores.parquet")
            assert np.isfinite(scores["decoder_cost"]).all() and np.isfinite(scores["decoder_reward"]).all()
            assert row["mean_cost"] == pytest.approx(scores["decoder_cost"].mean())
            assert row["mean_reward"] == pytest.approx(scores["decoder_reward"].mean())
            assert row["ci95"][0] <= row["one_sided95"][0] <= row["mean_cost"] <= row["one_sided95"][1] \
                <= row["ci95"][1] and row["verdict"] in VERDICTS
    # the policies too (lambda does not apply to them)
    assert all(rows[(p, "policy")]["lambda"] is None for p in ("sft", "safe_rlhf", "safedpo"))
    # Best-of-N's decoder cost is its candidates' own score, the token-level ones' a fresh scoring
    lam = json.loads((toy_run / "results/tiny/calibration/lambda.json").read_text())
    assert rows[("bon", "star")]["lambda"] == lam["lambda_star"]
    assert rows[("args", "hat")]["lambda"] == lam["lambda_hat"]
    assert rows[("bon", "star")]["mean_cost"] == pytest.approx(audit["mean_cost"])
    # Best-of-N at lambda = 0 picks the most rewarding candidate: more reward than at lambda*, on the same prompts
    paired = {(r["method"], r["comparison"], r["metric"]): r for r in audit["paired"]}
    assert paired[("bon", "star - zero", "decoder_reward")]["mean"] <= 0
    assert paired[("bon", "star - zero", "decoder_cost")]["ci95"][1] < 0
    for method in ("bon", "args", "pargs", "cdq"):
        for comparison in ("star - zero", "star - max", "star - hat"):
            for metric in ("decoder_reward", "decoder_cost", "helpfulness", "harmfulness"):
                row = paired[(method, comparison, metric)]
                assert row["ci95"][0] <= row["mean"] <= row["ci95"][1] and row["n_prompts"] == 256


def test_the_paper_s_soft_estimator_is_audited_beside_bon_mode(toy_run):
    """Soft mode (Algorithm 1) at each beta of calibration.soft_betas, calibrated on the same scores:
    its lambda* applied to Best-of-N, held to tau on the test prompts beside the bon-mode lambda*."""
    audit = json.loads((toy_run / "results/tiny/eval/constraint_audit.json").read_text())
    rows = audit["soft_mode"]
    assert [r["beta"] for r in rows] == [0.1, 1.0, 10.0]
    names = {0.1: "0p1", 1.0: "1", 10.0: "10"}
    for row in rows:
        rec = json.loads((toy_run / f"results/tiny/calibration/lambda_soft_beta{names[row['beta']]}.json").read_text())
        assert rec["mode"] == "soft" and rec["beta"] == row["beta"] and rec["tau"] == audit["tau"]
        assert row["lambda"] == rec["lambda_star"] and row["verdict"] in VERDICTS
        assert row["one_sided95"][0] <= row["mean_cost"] <= row["one_sided95"][1]
    # the same scores, another target: soft mode's lambda* is not bon mode's
    assert all(row["lambda"] != audit["lambda_star"] for row in rows)


def test_figures_exist_as_png_and_pdf_with_sidecars(toy_run):
    from PIL import Image

    for name in FIGURES:
        png = toy_run / f"results/tiny/figures/{name}.png"
        pdf = toy_run / f"results/tiny/figures/{name}.pdf"
        assert pdf.read_bytes()[:5] == b"%PDF-"
        img = np.asarray(Image.open(png).convert("L"), dtype=float)
        assert img.shape[0] > 300 and img.shape[1] > 600 and img.std() > 20  # not blank
        record = json.loads((toy_run / f"results/tiny/figures/{name}.provenance.json").read_text())
        assert {"figure", "trail", "code", "software", "seeds", "host", "device", "params"} <= set(record)
        rules = {e["rule"] for e in record["trail"]}
        assert {"calibrate_lambda", "score", "sample", "train_sft", "make_toy_world"} <= rules
    record = json.loads((toy_run / "results/tiny/figures/tradeoff.provenance.json").read_text())
    rules = {e["rule"] for e in record["trail"]}
    assert {"aggregate", "evaluate_decoded", "judge_policy", "train_safe_rlhf", "train_safedpo", "decode_rgtg"} <= rules
    calib = next(e for e in record["trail"] if e["rule"] == "calibrate_lambda")
    assert any('"tau": -0.5' in p for p in calib["params"]) and calib["seed"] == 0


def _provenance(toy_run, figure):
    return subprocess.run([sys.executable, "-m", "lara", "trail", figure], cwd=toy_run, capture_output=True,
                          text=True)


def test_provenance_audit_holds_and_catches_an_altered_input(toy_run):
    ok = _provenance(toy_run, "results/tiny/figures/lambda_sweep.png")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "provenance holds" in ok.stdout and "rule calibrate_lambda" in ok.stdout and "seed 0" in ok.stdout
    target = toy_run / "results/tiny/calibration/scores.parquet"
    backup = target.with_suffix(".bak")
    shutil.copy2(target, backup)
    try:
        df = pd.read_parquet(target)
        df.loc[0, "cost"] += 1.0  # a deliberately altered upstream input
        df.to_parquet(target)
        broken = _provenance(toy_run, "results/tiny/figures/lambda_sweep.png")
        assert broken.returncode == 1
        assert "PROVENANCE BROKEN: results/tiny/calibration/scores.parquet" in broken.stdout
        assert broken.stdout.count("PROVENANCE BROKEN") == 1
    finally:
        shutil.move(backup, target)
    assert _provenance(toy_run, "results/tiny/figures/lambda_sweep.png").returncode == 0


def test_report_renders_in_headless_chromium(toy_run, tmp_path):
    report = tmp_path / "report.html"
    run_snakemake(toy_run, "--report", str(report))
    html = report.read_text()
    for name in FIGURES:
        assert f"{name}.png" in html
    # the captions carry this run's lambda* as the rule renders it (round(lambda_star, 4) in rules/common.smk),
    # read from the run's own lambda.json: its value depends on the machine's floating point, the caption must not
    lam = json.loads((toy_run / "results/tiny/calibration/lambda.json").read_text())
    shown = re.escape(str(round(lam["lambda_star"], 4)))
    assert re.search(rf"deployed (?:λ|\\u03bb)\* = {shown}(?![0-9])", html), "caption without this run's lambda*"
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (make test installs it with apt where it can)")
    shot = tmp_path / "report.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={tmp_path / 'chrome'}", "--window-size=1400,1000",
                    "--virtual-time-budget=10000", f"--screenshot={shot}", report.as_uri()],
                   check=True, capture_output=True, timeout=180)
    from PIL import Image

    img = np.asarray(Image.open(shot).convert("RGB"), dtype=float)
    assert img.shape[:2] == (1000, 1400)
    assert img.std() > 20 and len(np.unique(img.reshape(-1, 3), axis=0)) > 50  # rendered, not a blank page


def test_plot_option_reruns_only_the_figures(toy_run, tmp_path):
    counts, outputs = dry_run(toy_run, *override(tmp_path, "figures:\n  dpi: 120\n"))
    # and the settings table every figure records (results/{exp}/settings.tsv)
    assert counts == {"figure_lambda_sweep": 1, "figure_tradeoff": 1, "figure_calibration": 1,
                      "figure_decoders": 1, "figure_coverage": 1, "figure_deployment": 1,
                      "figure_constraints": 1, "figure_constraints_sweep": 1, "figure_frontier": 1,
                      "experiment_settings": 1}, counts


def test_tau_reruns_only_the_calibrated_evaluations_and_safe_rlhf_s(toy_run, tmp_path):
    counts, outputs = dry_run(toy_run, *override(tmp_path, "calibration:\n  tau: -0.25\n"))
    # 4 decoders at hat and star, Best-of-N at its certified crc, ltt and ltt_wsr, and pruned Best-of-N at its own hat,
    # star, crc, ltt and ltt_wsr (its zero and max, and its prefix scores, read no tau)
    assert counts.get("evaluate_decoded") == 16 and counts.get("judge_decoded") == 16
    assert counts.get("calibrate_prune") == 1 and counts.get("select_bon_prune") == 5 and "score_prefixes" not in counts
    assert counts.get("aggregate") == 1 and counts.get("figure_tradeoff") == 1
    assert "train_safedpo" not in counts
    # and Safe-RLHF, whose budget is tau: retrained, so its evaluation reruns too (the only policy that does)
    assert counts.get("evaluate_policy") == 1 and counts.get("judge_policy") == 1
    evals = {o for o in outputs if "/eval/" in o and o.endswith(".parquet")}
    assert evals and all(any(f"/{s}/" in o for s in ("star", "hat", "crc", "ltt", "ltt_wsr", "safe_rlhf"))
                         for o in evals)


def test_without_a_judge_its_jobs_are_skipped_with_a_message(toy_run, tmp_path):
    proc = run_snakemake(toy_run, "-n", *override(tmp_path, "evaluation:\n  judge: {model: null}\n"))
    out = proc.stdout + proc.stderr
    assert "LLM judge skipped" in out
    assert "judge_decoded" not in out and "judge_policy" not in out
    assert "rule aggregate" in out  # its inputs changed: it reruns without the judge columns


def test_lara_summary_reads_the_run_back(toy_run):
    """What to open first: `lara summary` prints the run's own lambda-hat, lambda*, audit verdicts and every row."""
    proc = subprocess.run([sys.executable, "-m", "lara", "summary", "results/tiny"], cwd=toy_run, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    lam = json.loads((toy_run / "results/tiny/calibration/lambda.json").read_text())
    audit = json.loads((toy_run / "results/tiny/eval/constraint_audit.json").read_text())
    assert f"lambda* = {lam['lambda_star']:.4g}" in proc.stdout
    assert f"lambda-hat = {lam['lambda_hat']:.4g}" in proc.stdout
    assert f"at lambda*: {audit['verdict']}" in proc.stdout
    summary = pd.read_csv(toy_run / "results/tiny/eval/summary.csv")
    for method, setting in zip(summary["method"], summary["setting"], strict=True):
        assert re.search(rf"^  {method} +{setting} ", proc.stdout, re.M), (method, setting)
