"""Every way of calling the workflow finds its tools, each job runs with the threads and CPU kernels
it declares, and each figure says what it shows (taken from its inputs, not from the config)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from lara.config import load_yaml, validate

from ..conftest import copy_workflow

pytestmark = pytest.mark.workflow

VENV_BIN = Path(sys.executable).parent


def _path_without_venv() -> str:
    return os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep)
                           if d and Path(d).resolve() != VENV_BIN.resolve())


def test_a_real_job_runs_through_the_venvs_snakemake_without_activation(tmp_path):
    """`.venv/bin/snakemake ...` with the venv not on PATH: the rules still find `lara`."""
    wf = copy_workflow(tmp_path / "wf")
    path = _path_without_venv()
    assert shutil.which("lara", path=path) is None  # nothing else on PATH would rescue it
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)} | {"PATH": path, "HF_HUB_OFFLINE": "1"}
    target = "results/tiny/toy/prompts.jsonl"
    proc = subprocess.run([str(VENV_BIN / "snakemake"), "--cores", "1", target], cwd=wf, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (wf / target).stat().st_size > 0
    assert "command not found" not in proc.stdout + proc.stderr


def test_snakemake_lint_finds_nothing(tmp_path):
    """Snakemake's own linter on the workflow definition: no findings (it exits 1 and lists them otherwise)."""
    wf = copy_workflow(tmp_path / "wf")
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--lint"], cwd=wf, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Congratulations, your workflow is in a good condition!" in out, out[-4000:]
    assert "Lints for" not in out


def test_jobs_use_the_threads_and_cpu_kernels_their_config_declares(toy_run):
    """Toy jobs declare one thread (resources.default.cpus_per_task) and pinned AVX2 kernels
    (numerics.cpu_kernels); every torch step logs what it got, and model provenance records it."""
    log = (toy_run / "logs/tiny/train_sft.log").read_text()
    assert "torch: 1 thread(s)" in log and "deterministic algorithms" in log
    prov = json.loads((toy_run / "results/tiny/models/sft/provenance.json").read_text())
    numerics = prov["numerics"]
    assert numerics["OMP_NUM_THREADS"] == "1" and numerics["torch_threads"] == 1
    assert numerics["MKL_CBWR"] == "AVX2,STRICT" and numerics["ATEN_CPU_CAPABILITY"] == "avx2"
    if os.uname().machine == "x86_64":  # the pin applies to x86-64 only
        assert numerics["torch_cpu_capability"] in ("AVX2", "DEFAULT")
        assert "CPU kernels AVX512" not in log
    assert prov["cpu"]


def _shows(toy_run, name):
    sidecar = json.loads((toy_run / f"results/tiny/figures/{name}.provenance.json").read_text())
    return sidecar["shows"]


def test_figures_name_the_policy_scorers_and_lambdas_behind_them(toy_run):
    res = "results/tiny"
    lam = json.loads((toy_run / res / "calibration/lambda.json").read_text())
    sweep = _shows(toy_run, "lambda_sweep")
    # Best-of-N candidates come from the SFT policy and are scored by the trained reward and cost models
    bon = dict(sweep["best_of_n"])
    n = bon.pop("n")
    assert bon == {"policy": f"{res}/models/sft", "reward_model": f"{res}/models/reward",
                   "cost_model": f"{res}/models/cost"}
    config = validate(load_yaml(toy_run / "config/config.yaml"))
    assert n == config["decode"]["bon_n"]
    assert sweep["lambda_star"] == round(lam["lambda_star"], 4) and sweep["lambda_hat"] == round(lam["lambda_hat"], 4)
    assert sweep["tau"] == lam["tau"] and sweep["calibration_mode"] == lam["mode"]
    assert sweep["calibrated_on"]["policy"] == f"{res}/models/sft"
    assert sweep["calibrated_on"]["n"] == config["calibration"]["samples_per_prompt"]
    # the tradeoff figure names the evaluation scorers (the toy oracle), not the decoding models
    trade = _shows(toy_run, "tradeoff")
    assert trade["evaluation"] == [{"reward_model": "oracle", "cost_model": "oracle"}]
    assert "bon/star" in trade["rows"] and "sft/policy" in trade["rows"]
    # the same description is in the PNG's own metadata
    description = Image.open(toy_run / res / "figures/lambda_sweep.png").info["Description"]
    assert f"policy {res}/models/sft" in description and f"lambda* = {round(lam['lambda_star'], 4)}" in description
