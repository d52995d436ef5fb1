"""`snakemake --profile slurm` on a real local SLURM cluster (munge, MariaDB + slurmdbd,
slurmctld, slurmd), started and stopped by this module. The toy DAG's data stage, base model and
SFT go through sbatch, the GPU rules on placeholder GPUs, and must match the local run."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from ..conftest import copy_workflow, local_slurm, snakemake_env

LocalSlurm, available = local_slurm().LocalSlurm, local_slurm().available

pytestmark = pytest.mark.slurm

TARGETS = ["results/tiny/data/sft.parquet", "results/tiny/data/preferences.parquet",
           "results/tiny/data/prompts_calibration.parquet", "results/tiny/data/prompts_test.parquet",
           "results/tiny/models/sft"]


def test_a_killed_owner_leaves_no_daemon_behind(tmp_path):
    """Start a cluster from a child process with a reaper, SIGKILL the child (no cleanup runs in
    it): the reaper stops every daemon and removes the configuration cache. (First in the module:
    two clusters cannot share munged's socket.)"""
    reason = available()
    if reason:
        pytest.skip(reason)
    code = ("import os, sys, time; sys.path.insert(0, sys.argv[1]); import local_cluster as lc; "
            "c = lc.LocalSlurm(sys.argv[2]).start(reap_with=os.getpid()); print('up', flush=True); time.sleep(600)")
    owner = subprocess.Popen([sys.executable, "-c", code, str(local_slurm().__file__).rsplit("/", 1)[0],
                              str(tmp_path / "c")], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout.readline().strip() == "up"
        cluster = LocalSlurm(tmp_path / "c")
        pids = cluster._pids()
        assert len(pids) == 5 and cluster.running()
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait()
        deadline = time.time() + 40  # the reaper's stop() is done when it has removed the pid file
        while time.time() < deadline and (any(local_slurm()._alive(p) for p in pids) or cluster.pids.exists()):
            time.sleep(0.5)
        assert not any(local_slurm()._alive(p) for p in pids), cluster.logs()
        assert not cluster.pids.exists() and not local_slurm().CONF_CACHE.exists()
        assert "owner" in (tmp_path / "c" / "log" / "reaper.out").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()
        LocalSlurm(tmp_path / "c").stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = available()
    if reason:
        pytest.skip(reason)
    c = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        c.start(reap_with=os.getpid())
    except Exception:
        print(c.logs())
        c.stop()
        raise
    yield c
    c.stop()
    # a configless slurmd's cache left behind would send every later SLURM client (and every
    # Snakemake start, through the executor plugin's scontrol probe) to this dead controller
    assert not local_slurm().CONF_CACHE.exists(), "stop() left /run/slurm/conf behind"


def test_the_daemons_listen_on_loopback_only(cluster):
    found = local_slurm().listening(cluster.ports.values())
    assert set(cluster.ports) == {"slurmctld", "slurmd", "slurmdbd", "mariadb"}
    assert all(found[port] == {"127.0.0.1"} for port in cluster.ports.values()), found


# The rules that ask for GPUs on the cluster's placeholder GPUs; SFT cut to one epoch (its quality is the
# local run's business, tests/workflow/test_train_calibrate.py): this run is about routing and launching
GPU_RESOURCES = """\
resources:
  rules:
    make_toy_model: {gpu: 1, gpu_model: fake, cpus_per_task: 1, mem_mb: 1500, runtime: 7}
    train_sft: {gpu: 2, gpu_model: fake, cpus_per_task: 2, mem_mb: 3000, runtime: 9}
train:
  sft: {epochs: 1, max_steps: 16}
"""


def test_toy_dag_through_sbatch_on_gpus_matches_the_local_run(cluster, request, tmp_path):
    """The toy DAG's data stage, base model and SFT through `snakemake --profile slurm`, in one run:
    every job goes through sbatch; the rules that ask for GPUs get exactly their GPUs, CPUs, memory and
    time limit from SLURM (the node has 4 placeholder GPUs as generic resources) and CUDA_VISIBLE_DEVICES
    names them inside the job; SFT on 2 GPUs runs as 2 processes under accelerate (on CPU here); the
    data and the base model are those of the local run."""
    if cluster.gpus < 2:
        pytest.skip("the local cluster could not create its placeholder GPU devices (mknod refused)")
    wf = copy_workflow(tmp_path / "wf")
    (wf / "gpu.yaml").write_text(GPU_RESOURCES)
    # the shipped profile with its placeholders filled in, as a user does: this cluster's account, its default
    # partition for CPU jobs, and a second partition (same node) for the rules the profile routes to GPUs
    site = wf / "site"
    site.mkdir()
    (site / "config.yaml").write_text((wf / "slurm" / "config.yaml").read_text().replace(
        "FILL-IN-ACCOUNT", "lara-test").replace("FILL-IN-CPU-PARTITION", "debug").replace(
        "FILL-IN-GPU-PARTITION", "gpu"))
    env = snakemake_env() | {"SLURM_CONF": str(cluster.conf)}
    cmd = [sys.executable, "-m", "snakemake", "--profile", "site", "--slurm-init-seconds-before-status-checks", "3",
           "--jobs", "2", "--verbose", *TARGETS, "--configfile", "config/config.yaml", "gpu.yaml"]
    proc = subprocess.run(cmd, cwd=wf, env=env, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:] + cluster.logs()
    out = proc.stdout + proc.stderr
    # every job went through sbatch: SLURM job ids in Snakemake's log and one SLURM log per job
    ids = set(re.findall(r"SLURM jobid (\d+)", out)) | set(re.findall(r"external jobid '?(\d+)", out))
    slurm_logs = list((wf / "logs" / "slurm").rglob("*.log"))
    n_jobs = 6  # make_toy_world, prepare_sft_data, prepare_preferences, split_prompts, make_toy_model, train_sft
    assert len(slurm_logs) == n_jobs, out[-3000:]
    assert len(ids) == n_jobs and {p.stem for p in slurm_logs} == ids
    fields = "JobID,Comment,AllocTRES,Timelimit,State,Account,Partition"
    acct = subprocess.run(["sacct", "-X", "-n", "-P", "-o", fields], env=env, capture_output=True, text=True).stdout
    jobs, routed = {}, {}
    for line in acct.splitlines():
        job_id, comment, tres, limit, state, account, partition = line.split("|")
        if job_id in ids and comment.startswith("rule_"):
            rule = comment.removeprefix("rule_").split("_wildcards_")[0]
            jobs[rule] = (dict(kv.split("=", 1) for kv in tres.split(",")), limit, state)
            routed[rule] = (account, partition)
    # the profile routes every job: its account everywhere, its GPU partition for SFT, the CPU one for the rest;
    # the sbatch line itself carries both (the plugin's own guesses would otherwise win over SBATCH_* variables)
    print("\n" + "\n".join(f"sacct: {rule}: account {a}, partition {p}" for rule, (a, p) in sorted(routed.items())))
    assert all(a == "lara-test" for a, _ in routed.values()), routed
    assert routed["train_sft"][1] == "gpu" and routed["prepare_sft_data"][1] == "debug", routed
    sbatch = next(line for line in out.splitlines() if "sbatch call:" in line and "rule_train_sft" in line)
    print(f"train_sft's {sbatch.strip()[:400]}")
    assert re.search(r"(-A|--account)[ =]'?lara-test", sbatch) and re.search(r"(-p|--partition)[ =]'?gpu", sbatch)
    print("\n" + "\n".join(f"sacct: {rule}: {tres} limit {limit} {state}" for rule, (tres, limit, state)
                             in sorted(jobs.items())))
    assert len(jobs) == n_jobs and all(state == "COMPLETED" for _, _, state in jobs.values()), acct
    for rule, gpus, cpus, mem, limit in (("make_toy_model", "1", "1", "1500M", "00:07:00"),
                                         ("train_sft", "2", "2", "3000M", "00:09:00")):
        tres, got_limit, state = jobs[rule]
        assert got_limit == limit, (rule, jobs[rule])
        assert tres["gres/gpu"] == gpus and tres["cpu"] == cpus and tres["mem"] == mem, (rule, tres)
    assert "gres/gpu" not in jobs["prepare_sft_data"][0]  # a CPU rule gets no GPU
    logs = wf / "logs" / "tiny"
    assert re.search(r"CUDA_VISIBLE_DEVICES=0$", (logs / "make_toy_model.log").read_text(), flags=re.M)
    sft_log = (logs / "train_sft.log").read_text()
    assert "CUDA_VISIBLE_DEVICES=0,1" in sft_log and "[rank 0/2]" in sft_log
    metrics = json.loads((wf / "results" / "tiny" / "models" / "sft" / "metrics.json").read_text())
    assert metrics["processes"] == 2 and metrics["eval_loss_final"] < metrics["eval_loss_initial"]
    # the outputs that do not depend on the cut SFT match the local run: the data and the base model (the
    # shared toy run, asked for only now, so it runs beside this SLURM run rather than before it)
    toy_run = request.getfixturevalue("toy_run")
    for name in ("sft", "preferences", "prompts_calibration", "prompts_test"):
        a = pd.read_parquet(wf / "results" / "tiny" / "data" / f"{name}.parquet")
        b = pd.read_parquet(toy_run / "results" / "tiny" / "data" / f"{name}.parquet")
        pd.testing.assert_frame_equal(a, b)
    from safetensors.numpy import load_file

    base = "results/tiny/models/base/model.safetensors"
    a, b = load_file(wf / base), load_file(toy_run / base)
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    print(f"SLURM job ids: {sorted(ids, key=int)}")
