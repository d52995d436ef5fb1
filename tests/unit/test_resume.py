"""A training run killed mid-way, or while it saves a checkpoint, resumes from its last complete
checkpoint and ends where an uninterrupted run ends; stale and incomplete checkpoints are set aside,
never resumed and never silently lost."""

import json
import math
import re
import signal
import subprocess
import sys
import time

SETTINGS = {"learning_rate": 1e-3, "epochs": 2, "batch_size": 4, "max_length": 128, "eval_fraction": 0.1,
            "save_steps": 20, "logging_steps": 10}


def command(tiny_world, root, settings=SETTINGS):
    return [sys.executable, "-m", "lara", "train-reward", "--model", str(tiny_world["base"]),
            "--data", str(tiny_world["preferences"]), "--settings", json.dumps(settings),
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


def test_a_run_killed_while_saving_resumes_to_the_weights_of_an_uninterrupted_run(tiny_world, tmp_path):
    from lara.io import sha256_file

    settings = dict(SETTINGS, max_steps=80)
    whole = subprocess.run(command(tiny_world, tmp_path / "whole", settings), capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr
    root = tmp_path / "killed"
    log1 = open(tmp_path / "killed.log", "w")  # noqa: SIM115 (closed after the process is killed)
    proc = subprocess.Popen(command(tiny_world, root, settings), stdout=log1, stderr=subprocess.STDOUT)
    staging = root / "ckpt" / ".staging-60"
    deadline = time.time() + 300
    while not staging.exists():  # the Trainer has begun writing checkpoint 60
        assert proc.poll() is None, (tmp_path / "killed.log").read_text()
        assert time.time() < deadline, "no checkpoint save within 300 s"
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log1.close()
    mid_save = staging.exists() and not (root / "ckpt" / "checkpoint-60").exists()
    assert not (root / "model").exists()
    assert (root / "ckpt" / "checkpoint-40" / "trainer_state.json").is_file()
    rerun = subprocess.run(command(tiny_world, root, settings), capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    if mid_save:  # the usual case: the kill landed while the save was being written
        assert "a checkpoint save was interrupted" in rerun.stderr
        assert f"resuming from {root / 'ckpt'}/checkpoint-40" in rerun.stderr
    assert not staging.exists()
    a = sha256_file(tmp_path / "whole" / "model" / "model.safetensors")
    b = sha256_file(root / "model" / "model.safetensors")
    print(f"killed mid-save: {mid_save}; weights sha256 uninterrupted {a[:16]}, resumed {b[:16]}")
    assert a == b, "the resumed run's weights differ from the uninterrupted run's"


def test_changed_settings_set_the_checkpoints_aside_and_changing_back_resumes_them(tiny_world, tmp_path):
    quick = dict(SETTINGS, max_steps=20, save_steps=10)
    cmd = command(tiny_world, tmp_path, quick)
    subprocess.run(cmd, check=True, capture_output=True)
    assert (tmp_path / "ckpt" / "checkpoint-20").is_dir()
    changed = command(tiny_world, tmp_path, dict(quick, learning_rate=5e-4))
    rerun = subprocess.run(changed, capture_output=True, text=True, check=True)
    assert "learning_rate changed since the checkpoints" in rerun.stderr and "moving them to" in rerun.stderr
    assert "starting from scratch" in rerun.stderr
    stale = list((tmp_path / "ckpt" / "stale").glob("*/checkpoint-20"))
    assert len(stale) == 1  # set aside, not deleted
    # back to the first settings: their checkpoints come back and the run resumes from its last one
    again = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "moving them back" in again.stderr and f"resuming from {tmp_path / 'ckpt'}/checkpoint-20" in again.stderr


def _checkpoint(ckpt, step, state='{"global_step": 1}', files=("optimizer.pt", "scheduler.pt", "model.safetensors")):
    d = ckpt / f"checkpoint-{step}"
    d.mkdir(parents=True)
    for name in files:
        (d / name).write_bytes(b"x")
    if state is not None:
        (d / "trainer_state.json").write_text(state)
    return d


def test_incomplete_checkpoints_are_never_resumed(tmp_path):
    from lara.train.common import last_checkpoint

    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt, 20)
    _checkpoint(ckpt, 40)
    _checkpoint(ckpt, 60, state='{"global_st')  # state cut off (an older writer, killed mid-write)
    _checkpoint(ckpt, 80, files=("model.safetensors",))  # optimizer and scheduler missing
    (ckpt / ".staging-100").mkdir()  # a save interrupted by a kill
    (ckpt / "checkpoint-notes").mkdir()  # not a checkpoint: ignored
    assert last_checkpoint(ckpt) == str(ckpt / "checkpoint-40")
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint-20", "checkpoint-40", "checkpoint-notes",
                                                      "incomplete"]
    assert sorted(p.name for p in (ckpt / "incomplete").iterdir()) == ["checkpoint-60", "checkpoint-80"]
    assert last_checkpoint(tmp_path / "none") is None


def test_a_checkpoint_without_optimizer_state_is_resumed_only_when_asked(tmp_path, caplog):
    from lara.train.common import last_checkpoint

    ckpt = tmp_path / "ckpt"
    _checkpoint(ckpt, 20)
    _checkpoint(ckpt, 40, files=("model.safetensors",))
    assert last_checkpoint(ckpt, resume_partial=True) == str(ckpt / "checkpoint-40")
    assert "FRESH optimizer/scheduler" in caplog.text
    assert last_checkpoint(ckpt) == str(ckpt / "checkpoint-20")
    assert "set resume_partial: true" in caplog.text


def test_logging_and_checkpoint_intervals_keep_the_checkpoints_other_settings_set_them_aside(tmp_path):
    from lara.train.checkpoints import fingerprint, set_aside_stale_checkpoints
    from lara.train.common import SFTSettings

    ckpt = tmp_path / "ckpt"
    data = tmp_path / "data.parquet"
    data.write_bytes(b"rows")
    base = SFTSettings(learning_rate=1e-3, save_steps=20, logging_steps=10)
    set_aside_stale_checkpoints(ckpt, fingerprint(base, {"data": data}))
    (ckpt / "checkpoint-20").mkdir()
    # how often a run logs or checkpoints, or whether it may resume partially, does not change what it trains
    relogged = SFTSettings(learning_rate=1e-3, save_steps=50, logging_steps=1, resume_partial=True)
    set_aside_stale_checkpoints(ckpt, fingerprint(relogged, {"data": data}))
    assert (ckpt / "checkpoint-20").is_dir()
    # a learning rate or a data change does: the checkpoints are set aside (three changes: two sets kept)
    for lr in (2e-3, 3e-3, 4e-3):
        set_aside_stale_checkpoints(ckpt, fingerprint(SFTSettings(learning_rate=lr), {"data": data}))
        assert not (ckpt / "checkpoint-20").exists()
        (ckpt / "checkpoint-20").mkdir()
    assert len(list((ckpt / "stale").iterdir())) == 2
    data.write_bytes(b"other rows")
    set_aside_stale_checkpoints(ckpt, fingerprint(SFTSettings(learning_rate=4e-3), {"data": data}))
    assert not (ckpt / "checkpoint-20").exists()
