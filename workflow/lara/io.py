"""File helpers: atomic outputs (nothing half-written is ever left behind) and hashes."""

from __future__ import annotations

import contextlib
import errno
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


# what a write can run into that says nothing about the data: the step fails cleanly (WriteError), the old
# output is left as it was; the first four are failures of the write whatever file the error names
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
ACCESS_ERRNOS = (errno.EACCES, errno.EPERM, errno.EIO)  # a write failure when they name the output (or nothing)
TEMPORARY_NAME_BYTES = len(".") + len(".") + 8 + len(".tmp")  # what the temporary name .NAME.xxxxxxxx.tmp adds


class WriteError(OSError):
    """An output could not be written (a full disk, a quota, a file size limit, a read-only or refused
    folder): the temporary file is removed and the old output, if there was one, is left as it was.
    ``path``: the output; ``reason``: the system's words for it; ``existed``: whether an old output was there."""

    def __init__(self, path: Path, reason: str, existed: bool, directory: bool = False):
        self.path, self.reason, self.existed, self.directory = Path(path), reason, existed, directory
        super().__init__(f"{path}: {self.explain()}")

    def explain(self) -> str:
        kept = (f"the old {'folder' if self.directory else 'file'} is left as it was" if self.existed
                else "nothing was left there")
        return f"{self.reason} while writing; {kept}"


def write_failure(exc: BaseException, *paths: Path) -> str | None:
    """The reason ``exc`` (raised while writing ``paths``: the output and its temporary) is a failure of the
    write itself, in the system's words (``no space left on device``), or None when it is something else."""
    code = getattr(exc, "errno", None) if isinstance(exc, OSError) else None
    if code is None:  # writers that wrap the error (safetensors, a library's own exception): the system's words
        text = str(exc)
        code = next((c for c in DISK_ERRNOS if os.strerror(c) in text), None)
    if code in ACCESS_ERRNOS:
        named = [n for n in (getattr(exc, "filename", None), getattr(exc, "filename2", None)) if n is not None]
        if named and not any(_under(Path(os.fsdecode(n)), p) for n in named for p in paths):
            return None  # an input that could not be read: not this write's failure
    elif code not in DISK_ERRNOS:
        return None
    words = os.strerror(code)
    return words[:1].lower() + words[1:]


def _under(path: Path, root: Path) -> bool:
    a, b = os.path.abspath(path), os.path.abspath(root)
    return a == b or a.startswith(b.rstrip(os.sep) + os.sep)


_ACTIVE: set[str] = set()  # the temporary paths of the atomic_output blocks running now
# run before a command writes anything (lara.cli: its inputs through the one reader, if its settings have not
# triggered that already): no output is ever written from inputs its contract row was not checked against
BEFORE_WRITE: list = []


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, directory: bool = False) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; move it into place only on success.

    On any exception the temporary file or directory is removed and ``path`` is left
    as it was (absent, for a fresh output). A write that fails for want of space, quota or
    permission (``DISK_ERRNOS``, ``ACCESS_ERRNOS``) is raised as a :class:`WriteError` saying so.
    ``path`` that is itself the temporary of an enclosing atomic_output is written in place (it is
    already atomic; a second temporary name would only lengthen the name).
    """
    path = Path(path)
    if os.path.abspath(path) in _ACTIVE:
        yield path
        return
    for hook in BEFORE_WRITE:
        hook()
    existed = os.path.lexists(path)
    tmp, in_body = None, False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(path)
        if directory:
            tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        else:
            fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
            os.close(fd)
            tmp = Path(name)
        _ACTIVE.add(os.path.abspath(tmp))
        in_body = True
        try:
            yield tmp
        finally:
            _ACTIVE.discard(os.path.abspath(tmp))
        in_body = False
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, (0o777 if directory else 0o666) & ~umask)  # mkstemp/mkdtemp create 0600/0700
        if directory:
            _usual_permissions(tmp, umask)
            _replace_folder(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            if tmp.is_dir() and not tmp.is_symlink():
                shutil.rmtree(tmp, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    tmp.unlink(missing_ok=True)
        if isinstance(exc, WriteError) or not isinstance(exc, Exception):
            raise
        if in_body:  # the caller's own code: only what failed writing the temporary
            reason = write_failure(exc, tmp)
        elif isinstance(exc, OSError) and exc.strerror:  # making the temporary, or moving it into place
            reason = exc.strerror[:1].lower() + exc.strerror[1:]
        else:
            reason = None
        if reason is None:
            raise
        raise WriteError(path, reason, existed, directory) from exc


def _replace_folder(tmp: Path, path: Path) -> None:
    """Put the finished folder ``tmp`` at ``path``: an old folder there is moved aside first and removed
    only once the new one is in place (put back if that fails), so a failure leaves the old one whole."""
    if not (os.path.lexists(path) and path.is_dir() and not path.is_symlink()):
        os.replace(tmp, path)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.rmdir(old)
    os.rename(path, old)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.rename(old, path)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_json(path: str | os.PathLike, obj) -> None:
    """A JSON record, written whole; a record with an identity is sealed (its identity carries a digest of its whole
    content, lara.read.files.record_seal): a hand edit of any field, however consistent, is refused when read."""
    if isinstance(obj, dict) and isinstance(obj.get("identity"), dict):
        obj = json.loads(json.dumps(obj, default=str))
        obj["identity"]["seal"] = record_seal(obj)
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def record_seal(data: dict) -> str:
    """A digest of a JSON record's whole content, or of a table's whole ``lara`` metadata record (its identity with
    the rows' digest, its settings and summary), but the seal itself (lara.read.files checks both)."""
    plain = json.loads(json.dumps(data, default=str))
    if isinstance(plain.get("identity"), dict):
        plain["identity"].pop("seal", None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]


def write_jsonl(path: str | os.PathLike, rows: list[dict]) -> None:
    with atomic_output(path) as tmp, open(tmp, "w") as fh:
        for row in rows:
            fh.write(json.dumps(row, sort_keys=True) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    return copy_hashed(path, None, chunk)


def copy_hashed(src: str | os.PathLike, dest: str | os.PathLike | None, chunk: int = 1 << 20) -> str:
    """Copy ``src`` to ``dest`` (None: only hash it) and return the sha256 of the bytes copied (so what is read
    later, from ``dest``, is exactly what was hashed, whatever happens to ``src`` meanwhile)."""
    h = hashlib.sha256()
    with open(src, "rb") as fin, open(dest, "wb") if dest is not None else contextlib.nullcontext() as fout:
        while block := fin.read(chunk):
            h.update(block)
            if fout is not None:
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
