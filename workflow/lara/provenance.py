"""Code version, software versions and input hashes carried by every output that matters."""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import platform
import socket
import subprocess
from datetime import UTC, datetime
from pathlib import Path

from lara.io import sha256_path
from lara.runtime import numerics_record

SOFTWARE = ("lara", "torch", "transformers", "trl", "datasets", "tokenizers", "accelerate",
            "numpy", "pandas", "scipy", "snakemake")


@functools.cache
def source_hash(module: str) -> str:
    """sha256 over the Python sources of a module or package (names and contents, sorted).

    Rules take this as a param, so editing a step's code reruns exactly that step's
    results and what depends on them.
    """
    mod = importlib.import_module(module)
    path = Path(mod.__file__)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


@functools.cache
def code_version() -> dict:
    """The git commit (and whether the tree is dirty) when run from a checkout, plus the
    package version and a hash of the whole package source."""
    out = {"package": _version("lara"), "source_sha256": source_hash("lara")}
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "workflow"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
        out.update(git_commit=commit, git_dirty=bool(dirty))
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions() -> dict:
    return {name: _version(name) for name in SOFTWARE} | {"python": platform.python_version()}


def cpu_model() -> str:
    """The CPU's model name (float results can differ between CPU families)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({platform.machine()})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str) -> dict:
    """What every record says of the code and the machine it was made on (a step's record, a figure's sidecar)."""
    return {"code": code_version(), "software": software_versions(), "host": socket.gethostname(), "device": device,
            "created": datetime.now(UTC).isoformat(timespec="seconds")}


def record(settings: dict, inputs: dict[str, str] | None = None, seed: int | None = None,
           device: str | None = None) -> dict:
    """A provenance record: settings, input hashes, code and software versions, host."""
    return {"settings": settings, "seed": seed, "cpu": cpu_model(), "numerics": numerics_record(),
            "inputs": {k: {"path": str(v), "sha256": sha256_path(v)} for k, v in (inputs or {}).items()},
            **machine(device or "cpu")}
