"""Shared fixtures. Workflow tests share one finished toy run (session scope) instead of
rerunning the DAG in every test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

# No test may reach the Hugging Face hub; the libraries read these at import time.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ("Snakefile", "rules", "config", "envs")


def snakemake_env() -> dict:
    """The environment for Snakemake subprocesses: this interpreter's bin first on PATH, so the
    rules' `lara` command is the one under test; the hub is never contacted."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    return env


def copy_workflow(dest: Path) -> Path:
    """A copy of the workflow definition (not the package: that is installed) in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name)
        else:
            shutil.copy2(src, dest / name)
    return dest


def run_snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "snakemake", "--cores", "2", *args]
    proc = subprocess.run(cmd, cwd=workdir, env=snakemake_env(), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="session")
def toy_run(tmp_path_factory) -> Path:
    """A workflow copy with the whole toy DAG finished (the default target)."""
    workdir = copy_workflow(tmp_path_factory.mktemp("toy") / "wf")
    run_snakemake(workdir)
    return workdir


@pytest.fixture()
def workflow_copy(tmp_path) -> Path:
    return copy_workflow(tmp_path / "wf")
