"""Per-figure provenance: the audit trail from a figure back to its data, code and parameters.

When a figure is drawn, :func:`write_sidecar` walks Snakemake's own job records
(``.snakemake/metadata``) from the figure's inputs upwards and writes
``<figure>.provenance.json`` with, for every upstream output: the rule that made it, its
params and shell command, its inputs, the seed it ran with, the step's own lara provenance
record where it has one (models: settings, host, device), and the file's sha256 at drawing
time; plus the figure files' own hashes, the code version (git commit, or package version and
source hash), software versions, host and device.

``lara trail FIGURE`` prints that trail and re-hashes every recorded file; it exits with
status 1, naming the file, when one is missing or no longer matches (an input altered after
the figure was drawn, or a figure drawn from other data than recorded).
"""

from __future__ import annotations

import json
import logging
import re
import socket
from base64 import urlsafe_b64encode
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

HELP = "print a figure's provenance trail and verify every recorded hash against the files on disk"

SUFFIX = ".provenance.json"


def sidecar_path(figure: str | Path) -> Path:
    figure = Path(figure)
    return figure.with_name(figure.stem + SUFFIX)


def metadata_record(path: str, root: Path = Path(".")) -> dict | None:
    """Snakemake's record of the job that made ``path`` (file persistence layout:
    urlsafe base64 of the path, split into directory parts of at most 254 characters)."""
    b64 = urlsafe_b64encode(path.encode()).decode()
    parts = [b64[i:i + 254] for i in range(0, len(b64), 254)]
    parts = ["@" + p for p in parts[:-1]] + [parts[-1]]
    f = root / ".snakemake" / "metadata" / Path(*parts)
    try:
        return json.loads(f.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _lara_record(path: Path) -> dict | None:
    """A step's own provenance: provenance.json of a model directory, or a parquet's metadata."""
    if path.is_dir() and (path / "provenance.json").is_file():
        rec = json.loads((path / "provenance.json").read_text())
        return {k: rec.get(k) for k in ("settings", "seed", "code", "host", "device", "created")}
    if path.suffix == ".parquet" and path.is_file():
        from lara.data.tables import read_metadata

        meta = read_metadata(path)
        return meta or None
    return None


def build_trail(inputs: list[str], root: Path = Path(".")) -> list[dict]:
    """Every upstream output of ``inputs``, nearest first, each once."""
    from lara.io import sha256_path

    entries, seen, queue = [], set(), list(inputs)
    while queue:
        path = queue.pop(0)
        if path in seen:
            continue
        seen.add(path)
        full = root / path
        rec = metadata_record(path, root)
        entry = {"path": path, "sha256": sha256_path(full) if full.exists() else None}
        if rec is None:
            entry["rule"] = None  # a source: data or a model that no job of this workflow made
        else:
            seed = re.search(r"--seed\s+(\d+)", rec.get("shellcmd") or "")
            entry |= {"rule": rec.get("rule"), "params": rec.get("params"), "shellcmd": rec.get("shellcmd"),
                      "inputs": rec.get("input", []), "seed": int(seed.group(1)) if seed else None,
                      "finished": datetime.fromtimestamp(rec["endtime"], UTC).isoformat(timespec="seconds")
                      if rec.get("endtime") else None}
            queue.extend(rec.get("input", []))
        lara_rec = _lara_record(full)
        if lara_rec:
            entry["lara"] = lara_rec
        entries.append(entry)
    return entries


def write_sidecar(figures: list[str], inputs: list[str], rule: str, params: dict, out: str | Path,
                  root: Path = Path("."), trail: list[dict] | None = None, shows: dict | None = None) -> dict:
    """Write the provenance sidecar of a figure (its PNG and PDF files) atomically; ``shows`` (what
    the figure shows, which the report caption prints) is stored with it."""
    from lara.io import atomic_output, sha256_path, write_json
    from lara.provenance import code_version, software_versions

    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        device = "cpu"
    trail = build_trail(list(inputs), root) if trail is None else trail
    record = {
        "figure": [{"path": f, "sha256": sha256_path(root / f)} for f in figures],
        "rule": rule, "params": params, "inputs": list(inputs), "shows": shows or {},
        "code": code_version(), "software": software_versions(), "host": socket.gethostname(), "device": device,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "seeds": {e["path"]: e["seed"] for e in trail if e.get("seed") is not None},
        "trail": trail,
    }
    with atomic_output(out) as tmp:
        write_json(tmp, record)
    return record


def verify(record: dict, root: Path = Path(".")) -> list[str]:
    """Problems found when re-hashing every recorded file (empty when the trail holds)."""
    from lara.io import sha256_path

    problems = []
    for e in record["figure"] + record["trail"]:
        if e.get("sha256") is None:
            continue
        p = root / e["path"]
        if not p.exists():
            problems.append(f"{e['path']}: missing (recorded sha256 {e['sha256'][:16]}…)")
            continue
        now = sha256_path(p)
        if now != e["sha256"]:
            problems.append(f"{e['path']}: sha256 {now[:16]}… no longer matches the recorded {e['sha256'][:16]}…")
    return problems


def format_trail(record: dict) -> str:
    lines = [f"figure: {', '.join(f['path'] for f in record['figure'])}",
             f"  drawn by rule {record['rule']} on {record['host']} ({record['device']}) at {record['created']}",
             f"  code: {json.dumps(record['code'])}",
             f"  software: {', '.join(f'{k} {v}' for k, v in record['software'].items() if v)}",
             f"  params: {json.dumps(record['params'])}", "upstream (nearest first):"]
    for e in record["trail"]:
        made = f"rule {e['rule']}" if e.get("rule") else "source (not made by this workflow)"
        lines.append(f"  {e['path']}  [{made}]  sha256 {str(e.get('sha256'))[:16]}…")
        if e.get("seed") is not None:
            lines.append(f"      seed {e['seed']}")
        for p in e.get("params") or []:
            lines.append(f"      param {p[:160]}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("figure", help="a figure (PNG/PDF) or its .provenance.json sidecar")
    parser.add_argument("--root", default=".", help="the workflow directory the recorded paths are relative to")
    parser.add_argument("--quiet", action="store_true", help="only the verdict")


def run(args) -> None:
    from lara.data.tables import DataError

    fig = Path(args.figure)
    side = fig if fig.name.endswith(SUFFIX) else sidecar_path(fig)
    if not side.is_file():
        raise DataError(f"{side}: no provenance sidecar for {args.figure}")
    record = json.loads(side.read_text())
    if not args.quiet:
        print(format_trail(record))
    problems = verify(record, Path(args.root))
    n = len(record["figure"]) + sum(1 for e in record["trail"] if e.get("sha256"))
    if problems:
        for p in problems:
            print(f"PROVENANCE BROKEN: {p}")
        print(f"{len(problems)} of {n} recorded files do not match")
        raise SystemExit(1)
    print(f"provenance holds: all {n} recorded hashes match the files on disk")
