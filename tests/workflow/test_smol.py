"""config/smol.yaml (SmolLM2-135M-Instruct end to end, `make smol`, about an hour): its DAG, and its
first real model job, SFT of the 134.5M-parameter model, cut to one step."""

import json
import re

import pytest

from ..conftest import run_snakemake

pytestmark = pytest.mark.workflow

CONFIGS = ("--configfile", "config/config.yaml", "config/smol.yaml")
BASE = "results/smol/import/smollm2-135m-instruct"


@pytest.fixture()
def smol_workflow(workflow_copy, smollm2):
    (workflow_copy / BASE).parent.mkdir(parents=True)
    (workflow_copy / BASE).symlink_to(smollm2)
    return workflow_copy


def test_the_smol_dag_runs_every_stage_on_smollm2(smol_workflow):
    proc = run_snakemake(smol_workflow, "-n", "--printshellcmds", *CONFIGS)
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, flags=re.M))
    assert int(counts["total"]) == 136 and "make_toy_model" not in counts  # the base is SmolLM2, not the toy
    for rule in ("train_sft", "train_reward_model", "train_cost_model", "train_safe_rlhf", "train_safedpo",
                 "calibrate_lambda", "select_bon", "figure_lambda_sweep", "evaluate_decoded", "coverage"):
        assert rule in counts, rule
    assert counts["train_partial_model"] == counts["train_value_model"] == "2"
    assert counts["decode_rgtg"] == "12"  # ARGS, PARGS, CD-Q at lambda 0, lambda-hat, lambda*, max
    assert counts["select_bon"] == "7"  # Best-of-N also at the certified lambdas (crc, ltt, ltt_wsr: the toy's bounds)
    # pruned Best-of-8 (the toy's schedule, decode.bon_prune): its prefixes, own lambda, 7 settings, sweep, coverage
    assert counts["score_prefixes"] == "3" and counts["calibrate_prune"] == "1" and counts["select_bon_prune"] == "7"
    assert counts["choose_decoder"] == counts["figure_frontier"] == "1"  # the token budgets' choice, its selection pool
    assert counts["calibrate_best_of_k"] == "3"  # Best-of-k through the calibration core at each Fig. 1 size
    assert f"lara train-sft --model {BASE} " in proc.stdout


def test_smollm2_sft_runs_as_a_workflow_job(smol_workflow):
    (smol_workflow / "smoke.yaml").write_text(
        "train: {sft: {max_steps: 1, batch_size: 2, max_length: 32, eval_fraction: 0.005, save_steps: 10}}\n")
    run_snakemake(smol_workflow, "results/smol/models/sft", *CONFIGS, "smoke.yaml")
    model = smol_workflow / "results" / "smol" / "models" / "sft"
    config = json.loads((model / "config.json").read_text())
    metrics = json.loads((model / "metrics.json").read_text())
    assert config["vocab_size"] == 49152 and config["num_hidden_layers"] == 30
    assert metrics["global_step"] == 1 and metrics["eval_loss_final"] < metrics["eval_loss_initial"] + 0.5
    prov = json.loads((model / "provenance.json").read_text())
    assert prov["inputs"]["base_model"]["path"].endswith("smollm2-135m-instruct")
