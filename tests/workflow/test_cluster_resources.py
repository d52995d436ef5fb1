"""`snakemake -n --profile slurm` on the paper configs: the full DAG with each job's resources."""

import json
import re

import pytest

from ..conftest import REPO, run_snakemake

pytestmark = pytest.mark.workflow

GPU_RULES = {"train_sft", "train_reward_model", "train_cost_model", "train_partial_model", "train_value_model",
             "sample", "score", "decode_rgtg", "train_safe_rlhf", "train_safedpo", "generate_policy"}
CPU_RULES = {"prepare_sft_data", "prepare_preferences", "split_prompts", "value_prompts", "calibrate_lambda",
             "select_bon", "bon_sweep"}


def job_resources(out: str) -> dict[str, list[dict]]:
    jobs: dict[str, list[dict]] = {}
    for block in re.split(r"\n(?=(?:localrule|rule) \w+:)", out):
        m = re.match(r"(?:localrule|rule) (\w+):", block)
        res = re.search(r"^\s+resources: (.*)$", block, flags=re.M)
        if m and res:
            pairs = dict(kv.split("=", 1) for kv in res.group(1).split(", "))
            jobs.setdefault(m.group(1), []).append(pairs)
    return jobs


@pytest.mark.parametrize("paper", ["paper-llama", "paper-qwen"])
def test_paper_dag_requests_gpus_where_the_paper_used_them(workflow_copy, paper):
    proc = run_snakemake(workflow_copy, "-n", "--profile", "slurm", "--configfile", f"config/{paper}.yaml",
                         "--printshellcmds")
    jobs = job_resources(proc.stdout)
    # the download of the hub models and data is a local rule (run on the submit host, where the network is;
    # a dry run does not say which rules are local), which every job that reads the hub waits for
    assert re.search(r"rule fetch_hub:\n(?:    .*\n)*?    localrule: True\n", (REPO / "rules" / "data.smk").read_text())
    assert len(jobs.pop("fetch_hub")) == 1
    # every training rule runs one process per GPU under accelerate, each with its share of the job's CPUs
    launched = {m.group(3): (int(m.group(1)), int(m.group(2))) for m in re.finditer(
        r"accelerate launch .*?--num_processes (\d+) .*?--num_cpu_threads_per_process (\d+) -m lara ([a-z-]+)",
        proc.stdout)}
    assert launched == {"train-sft": (2, 8), "train-reward": (2, 8), "train-cost": (2, 8), "train-partial": (2, 8),
                        "train-value": (2, 8), "train-safedpo": (2, 8), "train-safe-rlhf": (4, 8)}, launched
    assert "--config_file config/accelerate/fsdp-4gpu.yaml" in re.search(r".*train-safe-rlhf.*", proc.stdout).group(0)
    assert set(jobs) >= GPU_RULES | CPU_RULES, set(jobs)
    # 3 token-level decoders and Best-of-N at lambda 0, lambda-hat, lambda*, max
    assert len(jobs["decode_rgtg"]) == 12 and len(jobs["select_bon"]) == 4 and len(jobs["train_value_model"]) == 2
    assert len(jobs["sample"]) == len(jobs["score"]) == 3  # the calibration, CD-Q and Best-of-N pools
    for rule in GPU_RULES:
        for res in jobs[rule]:
            assert int(res["gpu"]) >= 1 and int(res["mem_mb"]) >= 64000, (rule, res)
    for rule in ("train_sft", "train_reward_model", "train_cost_model", "train_safedpo"):
        assert all(r["gpu"] == "2" for r in jobs[rule])
    assert [r["gpu"] for r in jobs["train_safe_rlhf"]] == ["4"]  # as in the paper
    # the site's facts come from the profile, in one place: every job its account, every job that asks for a
    # GPU the profile's GPU partition (and no GPU type from the experiment config), every other job the CPU one
    for rule, rules in jobs.items():
        for r in rules if rule != "all" else ():  # (the `all` target is no job)
            assert r["slurm_account"] == "FILL-IN-ACCOUNT" and r.get("gpu_model") in (None, "None"), (rule, r)
            wants_gpu = int(r.get("gpu", 0)) > 0
            assert r["slurm_partition"] == ("FILL-IN-GPU-PARTITION" if wants_gpu else "FILL-IN-CPU-PARTITION"), \
                (rule, r)
    assert len(jobs["generate_policy"]) == 5  # sft, safe_rlhf, safedpo and the two baseline variants
    assert len(jobs["train_safedpo"]) == 2  # SafeDPO and its Delta = 0 variant
    for rule in CPU_RULES:
        assert all("gpu" not in r for r in jobs[rule]), rule
    for rule, rules in jobs.items():
        for r in rules if rule != "all" else ():
            assert {"runtime", "mem_mb", "cpus_per_task"} <= set(r)
            assert not {"processes", "accelerate_config"} & set(r)  # how a job starts is not a resource


def test_toy_config_requests_no_gpus(workflow_copy):
    proc = run_snakemake(workflow_copy, "-n", "--profile", "slurm")
    jobs = job_resources(proc.stdout)
    assert "train_sft" in jobs and all("gpu" not in r for rs in jobs.values() for r in rs)


def test_the_base_model_revision_reaches_sft(workflow_copy):
    (workflow_copy / "rev.yaml").write_text("base_model:\n  revision: 0cb88a4f764b7a12671c53f0838cd831a0843b95\n")
    proc = run_snakemake(workflow_copy, "-n", "--printshellcmds", "--configfile", "config/paper-llama.yaml",
                         "rev.yaml")
    sft = next(line for line in proc.stdout.splitlines() if "lara train-sft" in line)
    assert "--model meta-llama/Llama-3.2-3B" in sft and "--revision 0cb88a4f764b7a12671c53f0838cd831a0843b95" in sft


def test_token_level_decoding_runs_in_the_model_dtype(workflow_copy):
    proc = run_snakemake(workflow_copy, "-n", "--printshellcmds", "--configfile", "config/paper-llama.yaml")
    decodes = [line for line in proc.stdout.splitlines() if "lara rgtg " in line]
    assert len(decodes) == 12 and all('"dtype": "bfloat16"' in line for line in decodes)
    # the Snakefile's configfile (the toy default) comes first, yet the paper run sees none of its values:
    # Safe-RLHF trains at ppo-lag.sh's learning rates by epochs, not the toy world's 80 steps at 50x
    ppo = json.loads(re.search(r"lara train-safe-rlhf .*--settings '([^']*)'", proc.stdout).group(1))
    assert (ppo["actor_lr"], ppo["critic_lr"], ppo["max_steps"], ppo["threshold"]) == (1.0e-5, 5.0e-6, -1, -4.0)


def test_vllm_engines_split_the_model_over_the_rules_gpus(workflow_copy):
    (workflow_copy / "vllm.yaml").write_text("generation: {backend: vllm}\n"
                                             "resources: {rules: {sample: {gpu: 2, cpus_per_task: 8}}}\n")
    proc = run_snakemake(workflow_copy, "-n", "--printshellcmds", "--configfile", "config/paper-llama.yaml",
                         "vllm.yaml")
    samples = re.findall(r"lara sample .*", proc.stdout)
    policies = re.findall(r"lara generate-policy .*", proc.stdout)
    assert len(samples) == 3 and all("--tensor-parallel 2" in c for c in samples)
    assert policies and not any("--tensor-parallel" in c for c in policies)  # one GPU: no split
