"""The conda environments of the rule groups agree with pyproject.toml."""

import re
import tomllib

import yaml

from ..conftest import REPO


def requirement_map(reqs):
    out = {}
    for req in reqs:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")
        out[name] = req[len(name):].replace(" ", "")
    return out


def test_env_package_lists_agree_with_pyproject():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = requirement_map(project["dependencies"])
    extras = {k: requirement_map(v) for k, v in project["optional-dependencies"].items()}
    known = declared | extras["vllm"]
    union = {}
    for env_file in sorted((REPO / "envs").glob("*.yaml")):
        env = yaml.safe_load(env_file.read_text())
        pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
        pins = requirement_map(pip)
        for name, spec in pins.items():
            assert name in known, f"{env_file.name}: {name} is not a dependency in pyproject.toml"
            assert spec == known[name], f"{env_file.name}: {name}{spec} but pyproject says {name}{known[name]}"
        union |= pins
    # every runtime dependency is in some rule group's environment (the Snakemake driver aside)
    missing = set(declared) - set(union) - {"snakemake", "snakemake-executor-plugin-slurm"}
    assert not missing, f"not in any envs/*.yaml: {sorted(missing)}"
    assert "vllm" in requirement_map(yaml.safe_load((REPO / "envs" / "generate.yaml").read_text())
                                     ["dependencies"][-1]["pip"])
