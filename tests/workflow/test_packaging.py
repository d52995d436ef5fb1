"""A non-editable install (`pip install .`, as a cluster image or a user outside the checkout gets it): the
package carries its schemas, so `lara validate-config` and `lara settings-schema --check` work from anywhere."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.workflow

REPO = Path(__file__).resolve().parents[2]


def test_a_non_editable_install_validates_configs_and_checks_its_settings_schema(tmp_path):
    # built from a copy, so setuptools' build/ and egg-info land there, not in the checkout
    src = tmp_path / "src"
    shutil.copytree(REPO / "workflow", src / "workflow",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    target = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                            "--target", str(target), str(src)], capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-3000:]
    assert (target / "lara" / "schemas" / "schema.yaml").is_file()
    assert (target / "lara" / "schemas" / "settings.schema.yaml").is_file()
    assert not (target / "lara" / "schemas" / "schema.yaml").is_symlink()
    # the installed copy, not the checkout: run from elsewhere with only the target ahead of the dependencies
    env = os.environ | {"PYTHONPATH": str(target)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "exp.yaml").write_text((REPO / "config" / "config.yaml").read_text())
    where = subprocess.run([sys.executable, "-c", "import lara; print(lara.__file__)"], cwd=elsewhere, env=env,
                           capture_output=True, text=True)
    assert where.stdout.strip().startswith(str(target)), where.stdout + where.stderr

    def lara(*args):
        return subprocess.run([sys.executable, "-m", "lara", *args], cwd=elsewhere, env=env, capture_output=True,
                              text=True, timeout=300)

    ok = lara("validate-config", "exp.yaml")
    assert ok.returncode == 0, ok.stderr[-3000:]
    check = lara("settings-schema", "--check")
    assert check.returncode == 0, check.stderr[-3000:]
    (elsewhere / "bad.yaml").write_text((elsewhere / "exp.yaml").read_text().replace("bon_n: 20", "bon_n: -3"))
    bad = lara("validate-config", "bad.yaml")
    assert bad.returncode != 0 and "decode.bon_n" in bad.stderr, bad.stderr[-3000:]


def test_the_conda_post_deploy_script_installs_this_checkout_editable(tmp_path):
    """What `snakemake --sdm conda` runs in each rule group's new environment (envs/<group>.post-deploy.sh). No
    conda here: a fresh virtual environment without lara plays the conda environment, its python first on PATH
    as in an activated environment; rules/common.smk exports LARA_SOURCE as the workflow does."""
    script = REPO / "envs" / "install-lara.sh"
    for env_file in sorted((REPO / "envs").glob("*.yaml")):
        assert env_file.with_suffix(".post-deploy.sh").resolve() == script, env_file.name
    src = tmp_path / "checkout"
    shutil.copytree(REPO / "workflow", src / "workflow", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    venv = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {"PATH": f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path)}
    refused = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and "LARA_SOURCE" in refused.stderr
    done = subprocess.run(["bash", str(script)], env=env | {"LARA_SOURCE": str(src)}, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    probe = ("import importlib.metadata as m, lara; print(lara.__file__); "
             "print(sorted(e.name for e in m.entry_points(group='lara.scorers')))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", probe], env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert out[0] == str(src / "workflow" / "lara" / "__init__.py")  # the checkout's code, not a copy of it
    assert "oracle" in out[1]  # the named scorers' entry points came with it
    assert (venv / "bin" / "lara").is_file()
