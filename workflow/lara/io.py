"""File helpers: atomic outputs (nothing half-written is ever left behind) and hashes."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path


def _usual_permissions(root: Path, umask: int) -> None:
    """Give every file and folder under ``root`` the permissions the umask gives a new one (writers
    such as safetensors' save create 0600 files through their own temporary files); execute bits
    are kept where they were."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            os.chmod(os.path.join(dirpath, name), 0o777 & ~umask)
        for name in filenames:
            f = os.path.join(dirpath, name)
            if not os.path.islink(f):
                os.chmod(f, ((0o666 | (os.stat(f).st_mode & 0o111)) & ~umask))


STARTED = time.time()  # this process's start: a temporary file older than it belongs to an earlier one
log = logging.getLogger(__name__)


def remove_stale_temporaries(path: Path) -> list[Path]:
    """Remove the temporary files and folders (``.NAME.*.tmp``) that a writer of ``path`` killed by an
    earlier process (SIGKILL, a scheduler's time limit, a power cut) left beside it: only a process
    that ended without its cleanup leaves them, and only those older than this process are removed (a
    writer running now, in another rank, is left alone)."""
    stale = [p for p in path.parent.glob(f".{glob.escape(path.name)}.*.tmp") if p.lstat().st_mtime < STARTED - 1]
    for p in stale:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    if stale:
        log.info("removed %d temporary file(s) an interrupted earlier write of %s left behind: %s", len(stale),
                 path, ", ".join(p.name for p in stale))
    return stale


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only on success.

    On any exception the temporary file or directory is removed and ``path`` is left
    as it was (absent, for a fresh output).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    if directory:
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    else:
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)  # mkstemp/mkdtemp create 0600/0700
        if directory:
            _usual_permissions(tmp, umask)
            if path.exists():
                shutil.rmtree(path)
            os.replace(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


def write_json(path: str | os.PathLike, obj) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    with atomic_output(path) as tmp, open(tmp, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def copy_hashed(src: str | os.PathLike, dest: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Copy ``src`` to ``dest`` and return the sha256 of the bytes copied (so what is read later, from
    ``dest``, is exactly what was hashed, whatever happens to ``src`` meanwhile)."""
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dest, "wb") as fout:
        while block := fin.read(chunk):
            h.update(block)
            fout.write(block)
    return h.hexdigest()


def sha256_path(path: str | os.PathLike) -> str:
    """sha256 of a file, or of a directory's files (relative names and contents, sorted). A path that is
    neither is refused: its hash would be that of nothing, and a provenance record would vouch for it."""
    path = Path(path)
    if path.is_file():
        return sha256_file(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such file or directory to hash")
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + b"\0" + sha256_file(f).encode())
    return h.hexdigest()
