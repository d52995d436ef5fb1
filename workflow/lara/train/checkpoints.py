"""Checkpoints that are complete or absent, and resumed only under the settings and inputs they were
made with: one module for both training loops (the TRL Trainer stages, :mod:`lara.train.common`,
and PPO-Lagrangian, :mod:`lara.train.ppo_lag`).

Each checkpoint is written into ``.staging-N`` and renamed to ``checkpoint-N`` only once every file
is there (:func:`publish`), so a job killed while saving leaves a staging folder, which the next run
removes (:func:`remove_interrupted_saves`). The folder is stamped with the fingerprint of the
settings and inputs (:func:`fingerprint`); checkpoints made under another one are set aside and
brought back when it returns (:func:`set_aside_stale_checkpoints`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from lara.io import write_json

log = logging.getLogger(__name__)

STAGING = ".staging-"  # checkpoint-N is written here and renamed into place once complete
KEEP_SET_ASIDE = 2  # stale checkpoint sets / incomplete checkpoints kept for inspection


def prune(folder: Path, keep: int = KEEP_SET_ASIDE) -> None:
    """Keep the ``keep`` newest entries of ``folder`` (by modification time)."""
    entries = sorted(folder.iterdir(), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
    for old in entries[:-keep] if keep else entries:
        shutil.rmtree(old, ignore_errors=True)


def remove_interrupted_saves(checkpoint_dir: Path) -> None:
    """Remove the staging folders of saves that a killed job never finished."""
    for staging in Path(checkpoint_dir).glob(f"{STAGING}*"):
        log.warning("%s: a checkpoint save was interrupted (job killed while saving?); removing the partial copy",
                    staging)
        shutil.rmtree(staging, ignore_errors=True)


def numbered(checkpoint_dir: Path) -> list[tuple[int, Path]]:
    """The ``checkpoint-N`` folders of ``checkpoint_dir``, oldest first."""
    return sorted((int(p.name.split("-", 1)[1]), p) for p in Path(checkpoint_dir).glob("checkpoint-*")
                  if p.is_dir() and p.name.split("-", 1)[1].isdigit())


def staging_dir(checkpoint_dir: Path, step: int) -> Path:
    return Path(checkpoint_dir) / f"{STAGING}{step}"


def publish(written: Path, checkpoint_dir: Path, step: int, keep: int) -> None:
    """Rename a complete checkpoint (``written``, inside or equal to the staging folder of ``step``) to
    ``checkpoint-N``, replacing an older one of that step, and remove the staging folder; then remove all but the
    ``keep`` newest ``checkpoint-N`` folders."""
    final = Path(checkpoint_dir) / f"checkpoint-{step}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(written, final)
    shutil.rmtree(staging_dir(checkpoint_dir, step), ignore_errors=True)
    for _, old in numbered(checkpoint_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def fingerprint(settings, inputs: dict[str, str | Path]) -> dict:
    """What a checkpoint must have been trained with to be resumed: the settings that can change
    the result (not how often it logs or checkpoints), and the inputs (data by content hash; a
    model directory by its provenance record, else its path)."""
    from lara.io import sha256_file

    def ident(path):
        p = Path(path)
        if p.is_file():
            return sha256_file(p)
        if (p / "provenance.json").is_file():
            return sha256_file(p / "provenance.json")
        return str(path)

    return {"settings": settings.result_settings(), "inputs": {k: ident(v) for k, v in inputs.items()}}


def set_aside_stale_checkpoints(checkpoint_dir: Path, fp: dict) -> None:
    """When the checkpoints in ``checkpoint_dir`` were made with other settings or inputs than ``fp``,
    move them (with their fingerprint) to ``stale/<fingerprint>/``, keeping the newest two such sets;
    when a set there was made with ``fp``, move it back, so changing a setting and changing it back
    resumes where the run stopped. Then stamp ``checkpoint_dir`` with ``fp``."""
    import hashlib

    def key(f: dict) -> str:
        return hashlib.sha256(json.dumps(f, sort_keys=True).encode()).hexdigest()[:12]

    stamp = checkpoint_dir / "fingerprint.json"
    from lara.read.files import json_file
    old = json_file(stamp, mapping=False) if stamp.is_file() else None
    new = json.loads(json.dumps(fp))
    ours = [p for p in checkpoint_dir.glob("checkpoint-*") if p.is_dir()] if checkpoint_dir.is_dir() else []
    if old is not None and old != new:
        changed = sorted(k for part in ("settings", "inputs") for k in set(old.get(part, {})) | set(new[part])
                         if old.get(part, {}).get(k) != new[part].get(k))
        aside = checkpoint_dir / "stale" / key(old)
        if ours:
            log.warning("%s changed since the checkpoints in %s were made: moving them to %s (the newest %d such "
                        "sets are kept)", ", ".join(changed), checkpoint_dir, aside, KEEP_SET_ASIDE)
            shutil.rmtree(aside, ignore_errors=True)
            aside.mkdir(parents=True)
            for p in ours:
                p.rename(aside / p.name)
            stamp.rename(aside / stamp.name)
            os.utime(aside)
            prune(aside.parent)
        ours = []
    back = checkpoint_dir / "stale" / key(new)
    if not ours and (back / "fingerprint.json").is_file():
        log.info("checkpoints made with these settings and inputs were set aside in %s: moving them back", back)
        for p in back.glob("checkpoint-*"):
            p.rename(checkpoint_dir / p.name)
        shutil.rmtree(back)
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    write_json(stamp, fp)


def resume_point(accelerator, checkpoint_dir: Path, fp: dict, last) -> str | Path | None:
    """The checkpoint every process resumes, ``last(checkpoint_dir)`` (the newest complete one, or None): first the
    main process tidies the folder (sets aside checkpoints made with other settings or inputs than ``fp``, and lets
    ``last`` remove interrupted saves and set incomplete ones aside), then all take the same one."""
    if accelerator.is_main_process:
        set_aside_stale_checkpoints(checkpoint_dir, fp)
        last(checkpoint_dir)
    accelerator.wait_for_everyone()
    resume = last(checkpoint_dir)
    if resume:
        log.info("resuming from %s", resume)
    else:
        log.info("no checkpoint in %s: starting from scratch", checkpoint_dir)
    return resume
