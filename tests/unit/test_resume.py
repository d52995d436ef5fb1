"""A training run killed mid-way resumes from its last checkpoint and ends at the same step."""

import json
import math
import re
import signal
import subprocess
import sys
import time

SETTINGS = {"learning_rate": 1e-3, "epochs": 2, "batch_size": 4, "max_length": 128, "eval_fraction": 0.1,
            "save_steps": 20, "logging_steps": 10}


def command(tiny_world, root):
    return [sys.executable, "-m", "lara", "train-reward", "--model", str(tiny_world["base"]),
            "--data", str(tiny_world["preferences"]), "--settings", json.dumps(SETTINGS),
            "--checkpoints", str(root / "ckpt"), "--out", str(root / "model")]


def test_killed_training_resumes_from_the_last_checkpoint(tiny_world, tmp_path):
    expected_steps = math.ceil(360 / 4) * 2  # 400 pairs, 10% held out, batch 4, 2 epochs
    log1 = open(tmp_path / "first.log", "w")  # noqa: SIM115 (closed after the process is killed)
    proc = subprocess.Popen(command(tiny_world, tmp_path), stdout=log1, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not (tmp_path / "ckpt" / "checkpoint-40").is_dir():
        assert proc.poll() is None, (tmp_path / "first.log").read_text()
        assert time.time() < deadline, "no checkpoint within 300 s"
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log1.close()
    assert not (tmp_path / "model").exists()  # nothing half-written
    done = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "ckpt").glob("checkpoint-*"))
    assert done and max(done) < expected_steps

    rerun = subprocess.run(command(tiny_world, tmp_path), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert f"resuming from {tmp_path / 'ckpt'}/checkpoint-{max(done)}" in rerun.stderr
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["global_step"] == expected_steps
    logged = [int(m) for m in re.findall(r"step (\d+)/\d+: loss=", rerun.stderr)]
    assert logged and min(logged) > max(done)  # the rerun went on from the checkpoint, not from step 0
    for name in ("training_settings.json", "provenance.json", "lara_scorer.json", "config.json"):
        assert (tmp_path / "model" / name).is_file()
    prov = json.loads((tmp_path / "model" / "provenance.json").read_text())
    assert len(prov["inputs"]["data"]["sha256"]) == 64 and prov["settings"]["kind"] == "reward"


def test_changed_settings_discard_stale_checkpoints(tiny_world, tmp_path):
    quick = dict(SETTINGS, max_steps=20, save_steps=10)
    cmd = command(tiny_world, tmp_path)
    cmd[cmd.index("--settings") + 1] = json.dumps(quick)
    subprocess.run(cmd, check=True, capture_output=True)
    cmd[cmd.index("--settings") + 1] = json.dumps(dict(quick, learning_rate=5e-4))
    rerun = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "discarding them" in rerun.stderr and "starting from scratch" in rerun.stderr


def test_a_checkpoint_killed_while_saving_is_deleted_and_the_one_before_resumed(tmp_path):
    from lara.train.common import last_checkpoint

    ckpt = tmp_path / "ckpt"
    for step, state in ((20, '{"global_step": 20}'), (40, '{"global_step": 40}'), (60, '{"global_st'), (80, None)):
        d = ckpt / f"checkpoint-{step}"
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(b"weights")
        if state is not None:  # 60: state cut off mid-write; 80: killed before the state was written
            (d / "trainer_state.json").write_text(state)
    (ckpt / "checkpoint-notes").mkdir()  # not a checkpoint: ignored
    assert last_checkpoint(ckpt) == str(ckpt / "checkpoint-40")
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint-20", "checkpoint-40", "checkpoint-notes"]
    assert last_checkpoint(tmp_path / "none") is None


def test_logging_and_checkpoint_intervals_keep_the_checkpoints_other_settings_discard_them(tmp_path):
    from lara.train.common import SFTSettings, discard_stale_checkpoints, fingerprint

    ckpt = tmp_path / "ckpt"
    data = tmp_path / "data.parquet"
    data.write_bytes(b"rows")
    base = SFTSettings(learning_rate=1e-3, save_steps=20, logging_steps=10)
    discard_stale_checkpoints(ckpt, fingerprint(base, {"data": data}))
    (ckpt / "checkpoint-20").mkdir()
    # how often a run logs or checkpoints does not change what it trains: its checkpoints are resumed
    relogged = SFTSettings(learning_rate=1e-3, save_steps=50, logging_steps=1)
    discard_stale_checkpoints(ckpt, fingerprint(relogged, {"data": data}))
    assert (ckpt / "checkpoint-20").is_dir()
    # a learning rate or a data change does: the checkpoints are discarded
    discard_stale_checkpoints(ckpt, fingerprint(SFTSettings(learning_rate=2e-3), {"data": data}))
    assert not (ckpt / "checkpoint-20").exists()
    (ckpt / "checkpoint-20").mkdir()
    data.write_bytes(b"other rows")
    discard_stale_checkpoints(ckpt, fingerprint(SFTSettings(learning_rate=2e-3), {"data": data}))
    assert not (ckpt / "checkpoint-20").exists()
