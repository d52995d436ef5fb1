"""The workflow as a Snakemake module of another workflow in another directory (`module lara: snakefile: ...
config: ...` with `use rule * from lara as lara_*`): the mapping the caller gives is the experiment (building on
a config file through `extends`), jobs run in the caller's directory, and a bad value is refused before any job."""

import re

import pytest

from lara.read.files import read_metadata

from ..conftest import copy_workflow, run_snakemake

pytestmark = pytest.mark.workflow

CALLER = """\
module lara:
    snakefile:
        {snakefile!r}
    config:
        {config!r}


use rule * from lara as lara_*
"""


def _caller(root, wf, config):
    root.mkdir(parents=True, exist_ok=True)
    (root / "Snakefile").write_text(CALLER.format(snakefile=str(wf / "Snakefile"), config=config))
    return root


def test_the_workflow_runs_as_a_module_of_another_workflow(tmp_path):
    wf = copy_workflow(tmp_path / "lara")
    config = {"extends": str(wf / "config" / "config.yaml"), "experiment": "viamodule",
              "data": {"sft": {"max_examples": 120}, "prompts": {"n_calibration": 30, "n_test": 40}}}
    caller = _caller(tmp_path / "caller", wf, config)
    dry = run_snakemake(caller, "-n").stdout
    assert "results/viamodule/calibration/lambda.json" in dry
    stats = dict(re.findall(r"^(\w+)\s+(\d+)$", dry.split("Job stats:")[1].split("\n\n")[0], flags=re.M))
    total = int(stats.pop("total"))
    assert all(j.startswith("lara_") for j in stats) and stats["lara_train_sft"] == "1"
    assert total == sum(map(int, stats.values())) >= 90  # the whole toy DAG

    run_snakemake(caller, "results/viamodule/data/sft.parquet", "results/viamodule/data/prompts_test.parquet")
    res = caller / "results" / "viamodule"
    meta = read_metadata(res / "data" / "sft.parquet")
    assert meta["rows_out"] == 120 and meta["settings"]["max_examples"] == 120  # the module config's value
    assert read_metadata(res / "data" / "prompts_test.parquet")["settings"]["n_test"] == 40
    assert (caller / "logs" / "viamodule" / "prepare_sft_data.log").is_file()
    assert not (wf / "results").exists()  # the jobs ran in the caller's directory

    bad = _caller(tmp_path / "bad", wf, config | {"calibration": {"tau": "low"}})
    proc = run_snakemake(bad, "-n", check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "the config given to `module lara`: invalid configuration" in out and "calibration.tau" in out
