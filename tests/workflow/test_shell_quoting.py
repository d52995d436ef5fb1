"""Every configurable string reaches the jobs' shell commands as one intact argument: a hostile
value ($(...), backticks, ;, &, quotes, spaces) through every string key, the dry run's printed
commands then run by bash with `lara` replaced by a recorder. Nothing is executed that the value
spells, and each value arrives byte for byte."""

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from ..conftest import run_snakemake

pytestmark = pytest.mark.workflow

HOSTILE = "evil $(touch PWNED); `touch PWNED2` 'q\" & z\\n"

# (key, value): every string a user sets that a rule passes on. The configuration is judged before any job
# (lara.config.validate), so each value is one validation accepts: local files and folders may carry any character
# (they are made below), a revision goes with a hub id, whose own characters are owner/name's
MADE = {"base_model.name_or_path": "dir", "evaluation.cost_model": "dir", "data.sft.source": "file",
        "data.preferences.source": "file", "data.prompts.source": "file", "deployment.prompts.source": "file"}
VALUES = {
    "base_model.name_or_path": "models/org-" + HOSTILE,
    "data.sft.source": "data/sft-" + HOSTILE + ".jsonl",
    "data.sft.split": "split " + HOSTILE,
    "data.preferences.source": "data/pref-" + HOSTILE + ".jsonl",
    "data.preferences.split": "psplit " + HOSTILE,
    "data.prompts.source": "data/prompts-" + HOSTILE + ".jsonl",
    "data.prompts.split": "qsplit " + HOSTILE,
    "data.prompts.column": "col " + HOSTILE,
    "deployment.prompts.source": "data/deploy-" + HOSTILE + ".jsonl",
    "evaluation.reward_model": "lab/reward-model",
    "evaluation.reward_model_revision": "rev " + HOSTILE,
    "evaluation.cost_model": "models/cm-" + HOSTILE,
    "evaluation.judge.base_url": "http://judge/" + HOSTILE,
    "evaluation.judge.model": "jm " + HOSTILE,
    # evaluation.judge.api_key_env is an environment variable's name ([A-Za-z_][A-Za-z0-9_]*): nothing to quote
}
# each constraint is audited by the hostile cost model (a constraint without `evaluation` would be given a role)
CONSTRAINTS = [{"name": "violence", "cost": "category:violence", "tau": -4.0, "bounds": [-5.5, 5.5],
                "evaluation": VALUES["evaluation.cost_model"]},
               {"name": "crime", "cost": "category:crime", "tau": -4.5, "bounds": [-5.5, 5.5],
                "evaluation": VALUES["evaluation.cost_model"]}]


def _make_values(workflow):
    """The local files and folders the hostile values name (a model folder holds a config.json)."""
    for key, kind in MADE.items():
        path = workflow / VALUES[key]
        if kind == "dir":
            path.mkdir(parents=True, exist_ok=True)
            (path / "config.json").write_text('{"vocab_size": 1024}')
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text('{"prompt": "p"}\n')


RECORDER = """#!{python}
import json, os, sys
with open(os.environ["LARA_ARGV_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv[1:]) + "\\n")
"""


def _nested(flat):
    out = {}
    for key, value in flat.items():
        node = out
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def _strings(token):
    """The strings an argument carries: itself, the spec of a NAME=SPEC pair, or every string inside a JSON object
    or list (a step's settings; the config layers the settings table is made from), keys and values."""
    named = re.match(r"^[a-z][a-z0-9_]*=(.*)$", token, flags=re.S)  # a constraint's NAME=SPEC (--cost, --evaluation)
    if named:
        return [named.group(1)]
    try:
        data = json.loads(token)
    except ValueError:
        return [token]
    if not isinstance(data, (dict, list)):
        return [token]
    out, todo = [], [data]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            todo += [*node.keys(), *node.values()]
        elif isinstance(node, list):
            todo += node
        elif isinstance(node, str):
            out.append(node)
    return out


def test_hostile_strings_reach_every_command_intact(workflow_copy, tmp_path):
    _make_values(workflow_copy)
    config = _nested(VALUES)
    config["calibration"] = {"constraints": CONSTRAINTS}
    (tmp_path / "hostile.yaml").write_text(yaml.safe_dump(config))
    proc = run_snakemake(workflow_copy, "-n", "-p", "--forceall", "--configfile", str(tmp_path / "hostile.yaml"))
    commands = [line.removeprefix("Shell command: ") for line in proc.stdout.splitlines()
                if line.startswith("Shell command: ") and line != "Shell command: None"]
    assert len(commands) > 40, proc.stdout[-2000:]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "lara").write_text(RECORDER.format(python=sys.executable))
    (bin_dir / "lara").chmod(0o755)
    argv_log = tmp_path / "argv.jsonl"
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", LARA_ARGV_LOG=str(argv_log))
    (workflow_copy / "logs" / "tiny").mkdir(parents=True, exist_ok=True)
    for cmd in commands:
        done = subprocess.run(["bash", "-c", cmd], cwd=workflow_copy, env=env, capture_output=True, text=True)
        assert done.returncode == 0, (cmd, done.stderr)
    assert not list(workflow_copy.rglob("PWNED*")), "a configured value was executed by the shell"
    calls = [json.loads(line) for line in argv_log.read_text().splitlines()]
    assert len(calls) == len(commands)
    carried = [s for argv in calls for token in argv for s in _strings(token) if "PWNED" in s]
    assert set(carried) <= set(VALUES.values()), sorted(set(carried) - set(VALUES.values()))
    missing = sorted(k for k, v in VALUES.items() if HOSTILE in v and v not in carried)
    assert missing == [], f"never passed to a command: {missing}"


# every command that loads a model (sample, score, train, decode, generate, evaluate) takes the experiment's dtype,
# in its --settings (lara.config.step_settings fills base_model.dtype into every step that names it)
MODEL_COMMANDS = {"train-sft", "train-reward", "train-cost", "train-partial", "train-value", "train-safe-rlhf",
                  "train-safedpo", "sample", "score", "rgtg", "generate-policy", "evaluate"}


def test_every_model_loading_command_gets_the_dtype(workflow_copy, tmp_path):
    (tmp_path / "bf16.yaml").write_text("base_model: {dtype: bfloat16}\n")
    proc = run_snakemake(workflow_copy, "-n", "-p", "--forceall", "--configfile", "config/config.yaml",
                         str(tmp_path / "bf16.yaml"))
    seen = set()
    for line in proc.stdout.splitlines():
        if not line.startswith("Shell command: "):
            continue
        argv = line.split()
        command = next((argv[i + 1] for i, a in enumerate(argv) if a.endswith("lara") or a == "lara"), None)
        if command in MODEL_COMMANDS:
            seen.add(command)
            assert '"dtype": "bfloat16"' in line and "--dtype" not in line, line[:300]
    assert seen == MODEL_COMMANDS, MODEL_COMMANDS - seen
