"""Training under `accelerate launch` with two CPU processes (gloo), started exactly as the rules start
it (lara.config.launch_command): two processes with the same global batch follow one process's loss
curve, only the main process writes the model, its records and the checkpoints, and a killed
two-process run resumes to the weights of an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from lara.config import launch_command, launch_plan

BIN = Path(sys.executable).parent
FSDP_CONFIG = Path(__file__).resolve().parents[2] / "config" / "accelerate" / "fsdp-4gpu.yaml"


def launch(processes: int) -> list[str]:
    """The rules' command prefix for a job of ``processes`` CPU processes with one thread each."""
    cmd = launch_command(launch_plan({"processes": processes, "cpus_per_task": processes}))
    return [str(BIN / cmd[0]), *cmd[1:]]


def env() -> dict:
    return os.environ | {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def sft_data(ppo_inputs) -> Path:
    return ppo_inputs / "sft.parquet"


SFT = {"learning_rate": 3e-3, "max_steps": 24, "max_length": 128, "eval_fraction": 0.1, "save_steps": 8,
       "logging_steps": 4}


def sft_command(tiny_world, data, root, processes, **settings):
    s = SFT | {"batch_size": 8 // processes} | settings  # the same global batch of 8
    return [*launch(processes), "train-sft", "--model", str(tiny_world["base"]), "--data", str(data),
            "--settings", json.dumps(s), "--checkpoints", str(root / "ckpt"), "--out", str(root / "model")]


def run(cmd) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def losses(model_dir: Path) -> list[float]:
    history = json.loads((model_dir / "metrics.json").read_text())["log_history"]
    return [h["loss"] for h in history if "loss" in h]


def weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(model_dir / "model.safetensors")


def test_launch_plan_and_command():
    from lara.config import ConfigError

    assert launch_command(launch_plan({"cpus_per_task": 4})) == ["lara"]
    assert launch_command(launch_plan({"gpu": 1, "cpus_per_task": 8})) == ["lara"]
    two = launch_command(launch_plan({"gpu": 2, "cpus_per_task": 16}))
    assert two[:3] == ["accelerate", "launch", "--multi_gpu"] and two[-2:] == ["-m", "lara"]
    assert two[two.index("--num_processes") + 1] == "2" and two[two.index("--num_cpu_threads_per_process") + 1] == "8"
    assert two[two.index("--main_process_port") + 1] == "0"  # a free port: two jobs on one node never collide
    fsdp = launch_command(launch_plan({"gpu": 4, "cpus_per_task": 32, "accelerate_config": "config/accelerate/f.yaml"}))
    assert fsdp[2:4] == ["--config_file", "config/accelerate/f.yaml"] and "--multi_gpu" not in fsdp
    with pytest.raises(ConfigError, match=r"resources.rules.x.processes: 3 processes for 2 GPUs"):
        launch_plan({"gpu": 2, "processes": 3, "cpus_per_task": 8}, "resources.rules.x")
    with pytest.raises(ConfigError, match=r"processes: 4 processes need at least as many CPUs \(cpus_per_task is 2\)"):
        launch_plan({"processes": 4, "cpus_per_task": 2})


@pytest.fixture(scope="module")
def sft_two(tiny_world, sft_data, tmp_path_factory) -> tuple[Path, str, float]:
    """The uninterrupted two-process SFT run (its folder, its log, its seconds): the reference of both tests
    below, run once."""
    root = tmp_path_factory.mktemp("sft_two")
    t0 = time.perf_counter()
    log = run(sft_command(tiny_world, sft_data, root, 2))
    return root, log, time.perf_counter() - t0


def test_two_processes_follow_one_process_and_only_the_main_one_writes(tiny_world, sft_data, sft_two, tmp_path):
    one = tmp_path / "one"
    two, log_two, seconds_two = sft_two
    t0 = time.perf_counter()
    run(sft_command(tiny_world, sft_data, one, 1))
    t1 = time.perf_counter()
    a, b = losses(one / "model"), losses(two / "model")
    print(f"\nSFT, global batch 8, 24 steps: 1 process {t1 - t0:.1f} s, losses {a}\n"
          f"                               2 processes {seconds_two:.1f} s, losses {b}")
    assert len(a) == len(b) == 6
    np.testing.assert_allclose(b, a, rtol=1e-4)  # the same data per step; only the order of the sums differs
    assert a[-1] < a[0]
    ma, mb = json.loads((one / "model" / "metrics.json").read_text()), json.loads((two / "model" / "metrics.json")
                                                                                   .read_text())
    assert ma["processes"] == 1 and mb["processes"] == 2 and ma["global_step"] == mb["global_step"] == 24
    wa, wb = weights(one / "model"), weights(two / "model")
    drift = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(f"largest weight difference after 24 steps: {drift:.2e}")
    assert drift < 1e-5

    # one writer: rank 0 logs what it saves; rank 1 logs only warnings; no temporary or staging copies remain
    assert "[rank 0/2]" in log_two and "saved sft model to" in log_two
    assert not [line for line in log_two.splitlines() if "[rank 1/2] INFO" in line]
    assert sorted(p.name for p in (two / "ckpt").iterdir()) == ["checkpoint-16", "checkpoint-24", "fingerprint.json"]
    assert not list(two.glob(".*")) and not list((two / "ckpt").glob(".staging-*"))
    for step in (16, 24):
        names = {p.name for p in (two / "ckpt" / f"checkpoint-{step}").iterdir()}
        assert {"trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"} <= names


def test_a_killed_two_process_run_resumes_to_the_uninterrupted_weights(tiny_world, sft_data, sft_two, tmp_path):
    import torch

    whole = sft_two[0]
    root = tmp_path / "killed"
    with open(tmp_path / "killed.log", "w") as out:
        proc = subprocess.Popen(sft_command(tiny_world, sft_data, root, 2), stdout=out, stderr=subprocess.STDOUT,
                                env=env(), start_new_session=True)
        deadline = time.time() + 300
        while not (root / "ckpt" / "checkpoint-8").is_dir():
            assert proc.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both workers, as SLURM's scancel does
        proc.wait()
    assert not (root / "model").exists()
    rerun = run(sft_command(tiny_world, sft_data, root, 2))
    assert f"resuming from {root / 'ckpt'}/checkpoint-" in rerun
    wa, wb = weights(whole / "model"), weights(root / "model")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert losses(root / "model")[-1] == losses(whole / "model")[-1]


def ppo_command(tiny_world, ppo_inputs, root, processes, **settings):
    # greedy rollouts (top_k 1) so that both runs see the same responses; one PPO minibatch per rollout
    per_process = 8 // processes
    s = {"max_steps": 3, "prompt_batch_size": per_process, "train_batch_size": per_process, "top_k": 1,
         "max_new_tokens": 10, "save_steps": 2, "actor_lr": 1e-3, "critic_lr": 1e-3, "threshold": -10.0,
         "ptx_coeff": 1.0, "max_prompt_length": 64, "episode_cost_window_size": 12} | settings
    return [*launch(processes), "train-safe-rlhf", "--model", str(tiny_world["base"]), "--reward",
            str(ppo_inputs / "reward"), "--cost", str(ppo_inputs / "cost"), "--prompts", str(tiny_world["preferences"]),
            "--sft-data", str(ppo_inputs / "sft.parquet"), "--settings", json.dumps(s), "--checkpoints",
            str(root / "ckpt"), "--out", str(root / "model")]


def test_ppo_lagrangian_on_two_processes_follows_one(tiny_world, ppo_inputs, tmp_path):
    """The rollouts, the episode-cost window (gathered from every process), the dual steps on lambda, the
    PPO and ptx updates: two processes of 4 prompts reproduce one process of 8, step by step. The two processes
    are started as the paper's launch of this job, with the shipped FSDP config file: on CPU accelerate has no
    FSDP and runs them as plain data parallel (the sharded path needs GPUs); the rerun that resumes them is
    started as a 2-GPU job without a config file (--multi_gpu)."""
    import torch

    t0 = time.perf_counter()
    run(ppo_command(tiny_world, ppo_inputs, tmp_path / "one", 1))
    t1 = time.perf_counter()
    fsdp = launch_command(launch_plan({"processes": 2, "cpus_per_task": 2, "accelerate_config": str(FSDP_CONFIG)}))
    assert fsdp[2:4] == ["--config_file", str(FSDP_CONFIG)]
    cmd = ppo_command(tiny_world, ppo_inputs, tmp_path / "two", 2)
    log_two = run([str(BIN / fsdp[0]), *fsdp[1:], *cmd[cmd.index("lara") + 1:]])
    t2 = time.perf_counter()
    assert "accelerate: MULTI_CPU, 2 process(es)" in log_two
    a = json.loads((tmp_path / "one" / "model" / "history.json").read_text())["history"]
    b = json.loads((tmp_path / "two" / "model" / "history.json").read_text())["history"]
    keys = ("lambda", "episode_cost", "reward", "cost", "kl", "response_length", "loss_actor", "loss_reward_critic",
            "loss_cost_critic", "loss_ptx")
    print(f"\nPPO-Lag, 8 prompts per rollout, 3 rollouts: 1 process {t1 - t0:.1f} s, 2 processes {t2 - t1:.1f} s")
    for name, h in (("1 process", a), ("2 processes", b)):
        print(f"  {name}: " + "; ".join(f"{k} " + " ".join(f"{row[k]:.5g}" for row in h) for k in keys))
    assert [row["step"] for row in a] == [row["step"] for row in b] == [1, 2, 3]
    for k in keys:
        np.testing.assert_allclose([row[k] for row in b], [row[k] for row in a], rtol=1e-4, atol=1e-6, err_msg=k)
    # the window holds the 8 episodes of both processes per rollout (12 of the 24 at the end), as with one
    assert a[0]["episode_cost"] != a[1]["episode_cost"]
    assert "saved safe_rlhf model to" in log_two and "[rank 0/2]" in log_two

    # a rerun of the two-process job in the same checkpoint folder resumes at rollout 2 and ends the same
    again = run(ppo_command(tiny_world, ppo_inputs, tmp_path / "two", 2) [:-1] + [str(tmp_path / "again")])
    assert f"resuming from {tmp_path / 'two' / 'ckpt' / 'checkpoint-2'}" in again and "step 1/3" not in again
    assert json.loads((tmp_path / "again" / "history.json").read_text())["history"] == b
    assert sorted(p.name for p in (tmp_path / "two" / "ckpt").iterdir()) == ["checkpoint-2", "fingerprint.json"]
    assert {"loop_state.json", "model.safetensors"} <= {p.name for p in (tmp_path / "two" / "ckpt" / "checkpoint-2")
                                                        .iterdir()}
    wa, wb = weights(tmp_path / "one" / "model"), weights(tmp_path / "two" / "model")
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) < 1e-5
    wc = weights(tmp_path / "again")
    assert all(torch.equal(wb[k], wc[k]) for k in wb)



def test_the_shipped_fsdp_config_loads_in_accelerate():
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    cfg = load_config_from_file(str(FSDP_CONFIG))
    assert cfg.distributed_type == DistributedType.FSDP and cfg.num_processes == 4 and cfg.mixed_precision == "bf16"
    f = cfg.fsdp_config
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=f["fsdp_version"], auto_wrap_policy=f["fsdp_auto_wrap_policy"].lower(),
        reshard_after_forward=f["fsdp_reshard_after_forward"], state_dict_type=f["fsdp_state_dict_type"],
        cpu_offload=f["fsdp_offload_params"], activation_checkpointing=f["fsdp_activation_checkpointing"])
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True


@pytest.fixture(scope="module")
def scored_samples(tiny_world, tmp_path_factory) -> Path:
    """Responses with reward and cost scores (the value models' training data), from the toy pairs."""
    import pandas as pd

    pairs = pd.read_parquet(tiny_world["preferences"]).head(120)
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("mp_value") / "scores.parquet"
    pd.DataFrame({"prompt": pairs["prompt"], "response": pairs["response_0"], "reward": rng.normal(size=len(pairs)),
                  "cost": rng.normal(size=len(pairs))}).to_parquet(path)
    return path


TRAINERS = {  # command, its extra arguments, and what its model starts from
    "reward": ["train-reward"],
    "cost": ["train-cost"],
    "partial": ["train-partial", "--kind", "cost"],
    "value": ["train-value", "--kind", "reward"],
    "safedpo": ["train-safedpo"],
}


@pytest.mark.parametrize("trainer", sorted(TRAINERS))
def test_every_trainer_runs_on_two_processes_like_on_one(trainer, tiny_world, scored_samples, tmp_path):
    data = scored_samples if trainer == "value" else tiny_world["preferences"]
    settings = {"max_steps": 6, "max_length": 96, "logging_steps": 2, "save_steps": 100, "eval_fraction": 0.1}
    if trainer == "partial":
        settings["prefixes_per_pair"] = 1
    if trainer == "value":
        settings["samples_per_prompt"] = 1
    results = {}
    for n in (1, 2):
        root = tmp_path / str(n)
        run([*launch(n), *TRAINERS[trainer], "--model", str(tiny_world["base"]), "--data", str(data),
             "--settings", json.dumps(settings | {"batch_size": 8 // n}), "--checkpoints", str(root / "ckpt"),
             "--out", str(root / "model")])
        results[n] = json.loads((root / "model" / "metrics.json").read_text())
    assert results[1]["processes"] == 1 and results[2]["processes"] == 2
    assert results[1]["global_step"] == results[2]["global_step"] == 6
    curve = {n: [h["loss"] for h in r["log_history"] if "loss" in h] for n, r in results.items()}
    print(f"\n{trainer}: losses, 1 process {curve[1]}; 2 processes {curve[2]}")
    assert len(curve[1]) == 3
    np.testing.assert_allclose(curve[2], curve[1], rtol=1e-4, atol=1e-6)
    drift = max(float((a - b).abs().max()) for a, b in zip(weights(tmp_path / "1" / "model").values(),
                                                             weights(tmp_path / "2" / "model").values(), strict=True))
    assert drift < 1e-5
