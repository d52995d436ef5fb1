"""Per-figure provenance: the audit trail from a figure back to its data, code and parameters.

When a figure is drawn, :func:`write_sidecar` walks Snakemake's own job records (``.snakemake/metadata``) from the
figure's inputs upwards and writes ``<figure>.provenance.json`` with, for every upstream output: the rule that made it,
its params and shell command, its inputs, the seed it ran with, the step's own lara provenance record where it has one
(models: settings, host, device), and the file's sha256 at drawing time; plus the figure files' own hashes, the code
version (git commit, or package version and source hash), software versions, host and device.

``lara trail FIGURE`` prints that trail and re-hashes every recorded file. It exits with status 1 and says "broken",
naming the file, when FIGURE is not the figure its sidecar recorded (a sidecar copied from another figure), when a
recorded file is missing or no longer matches (an input altered after the figure was drawn, or a figure drawn from other
data than recorded), when an input has no entry of its own or the sidecar no longer matches its digest (which covers
every field: an entry removed, a caption value, param, seed or code version edited); and "unknown" when an entry has no
hash, a workflow output had no Snakemake record of its job (or was written after it), or an older sidecar's digest
covers only its figure, inputs and trail. A sidecar that is not one (corrupt JSON, missing keys) exits 2 naming the
file. It never says "holds" with a hole in the trail.
"""

from __future__ import annotations

import hashlib
import json
import logging
from base64 import urlsafe_b64encode
from datetime import UTC, datetime
from pathlib import Path

from lara.io import atomic_output, sha256_path, write_json
from lara.read.files import DataError, json_file, read_metadata

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
        return json_file(f, mapping=False)
    except (OSError, ValueError):
        return None


def _lara_record(path: Path) -> dict | None:
    """A step's own provenance: provenance.json of a model directory, or a parquet's metadata."""
    if path.is_dir() and (path / "provenance.json").is_file():
        rec = json_file((path / "provenance.json"), mapping=False)
        return {k: rec.get(k) for k in ("settings", "seed", "code", "host", "device", "created")}
    if path.suffix == ".parquet" and path.is_file():
        return read_metadata(path) or None
    return None


def seed_of(shellcmd: str | None) -> int | None:
    """The seed a job ran with: the ``seed`` of its ``--settings`` JSON (every step reads its seed there)."""
    import shlex

    try:
        words = shlex.split(shellcmd or "")
    except ValueError:
        return None
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "--settings":
            try:
                seed = json.loads(value).get("seed")
            except (ValueError, AttributeError):
                return None
            return seed if isinstance(seed, int) else None
    return None


SLACK_S = 2.0  # a file's modification time may trail its job's recorded end by the file system's granularity


def rewritten_after_job(path: Path, rec: dict) -> bool:
    """A file written after the Snakemake job that made it ended: the job's record (rule, params, inputs) is
    then not the file's story."""
    end = rec.get("endtime")
    return bool(end) and path.is_file() and path.stat().st_mtime > float(end) + SLACK_S


def build_trail(inputs: list[str], root: Path = Path("."), made_under: str | None = "results") -> list[dict]:
    """Every upstream output of ``inputs``, nearest first, each once. A file with no Snakemake record
    is a source (data or a model no job of this workflow made), except under ``made_under`` (the
    workflow's output folder), where it should have one: its origin is then ``unknown`` (the
    metadata was dropped or deleted) and :func:`verify` says so."""
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
            made_here = made_under is not None and Path(path).parts[:1] == (made_under,)
            entry |= {"rule": None, "origin": "unknown" if made_here else "source"}
            if made_here:
                log.warning("%s: no Snakemake record of the job that made it (.snakemake/metadata); its origin is "
                            "recorded as unknown", path)
        else:
            entry |= {"rule": rec.get("rule"), "origin": "rule", "params": rec.get("params"),
                      "shellcmd": rec.get("shellcmd"), "inputs": rec.get("input", []),
                      "seed": seed_of(rec.get("shellcmd")),
                      "finished": datetime.fromtimestamp(rec["endtime"], UTC).isoformat(timespec="seconds")
                      if rec.get("endtime") else None}
            queue.extend(rec.get("input", []))
            if rewritten_after_job(full, rec):
                entry["rewritten_after_job"] = True
                log.warning("%s: written after the job that made it finished (a step rerun by hand?); its Snakemake "
                            "record does not describe it", path)
        if entry["sha256"] is None:
            log.warning("%s: missing when the figure was drawn; no hash recorded", path)
        lara_rec = _lara_record(full)
        if lara_rec:
            entry["lara"] = lara_rec
        entries.append(entry)
    return entries


# what the digest of a sidecar covers; older sidecars (no ``digest_covers``) covered figure, inputs and trail only
DIGEST_COVERS = "every field but digest"
LEGACY_DIGEST = ("figure", "inputs", "trail")


def digest(record: dict, legacy: bool = False) -> str:
    """sha256 of everything the sidecar vouches for: every field but the digest itself (the figure's
    hashes, what its caption shows, rule, params, seeds, code and software versions, the trail), so an
    edited or truncated sidecar does not verify. ``legacy``: the older digest of figure, inputs and trail."""
    keys = LEGACY_DIGEST if legacy else sorted(k for k in record if k != "digest")
    body = {k: record.get(k) for k in keys}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def write_sidecar(figures: list[str], inputs: list[str], rule: str, params: dict, out: str | Path,
                  root: Path = Path("."), trail: list[dict] | None = None, shows: dict | None = None) -> dict:
    """Write the provenance sidecar of a figure (its PNG and PDF files) atomically; ``shows`` (what
    the figure shows, which the report caption prints) is stored with it."""
    from lara.provenance import machine

    try:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        device = "cpu"
    trail = build_trail(list(inputs), root) if trail is None else trail
    record = {
        "figure": [{"path": f, "sha256": sha256_path(root / f)} for f in figures],
        "rule": rule, "params": params, "inputs": list(inputs), "shows": shows or {}, **machine(device),
        "seeds": {e["path"]: e["seed"] for e in trail if e.get("seed") is not None},
        "trail": trail,
        "digest_covers": DIGEST_COVERS,
    }
    record["digest"] = digest(record)
    with atomic_output(out) as tmp:
        write_json(tmp, record)
    return record


REQUIRED = ("figure", "inputs", "trail")


def read_sidecar(path: Path) -> dict:
    """A sidecar's record; a file that is not one is a :class:`DataError` naming it."""
    try:
        record = json_file(path, mapping=False)
    except ValueError as exc:
        raise DataError(f"{path}: not a provenance sidecar, it does not parse as JSON ({exc})") from None
    if not isinstance(record, dict) or any(k not in record for k in REQUIRED):
        missing = [k for k in REQUIRED if not isinstance(record, dict) or k not in record]
        raise DataError(f"{path}: not a provenance sidecar, missing {', '.join(missing)}")
    bad = [i for i, e in enumerate(record["figure"] + record["trail"]) if not isinstance(e, dict) or "path" not in e]
    if bad:
        raise DataError(f"{path}: not a provenance sidecar, entries without a path at {bad[:5]}")
    return record


def verify(record: dict, root: Path = Path("."), figure: Path | None = None) -> list[tuple[str, str]]:
    """Problems with the trail, each (``BROKEN`` or ``UNKNOWN``, message; which is which: the module docstring);
    empty when it holds. ``figure``: the file the reader asked about."""
    problems = []
    if figure is not None:
        mine = [e for e in record["figure"] if Path(e["path"]).name == figure.name]
        if not figure.is_file():
            problems.append(("BROKEN", f"{figure}: no such figure beside its sidecar"))
        elif not mine:
            problems.append(("BROKEN", f"{figure}: this sidecar is the provenance of "
                                       f"{', '.join(Path(e['path']).name for e in record['figure'])}, not of "
                                       f"{figure.name} (a sidecar copied from another figure?)"))
        elif mine[0].get("sha256") != sha256_path(figure):
            problems.append(("BROKEN", f"{figure}: sha256 {sha256_path(figure)[:16]}… is not the recorded "
                                       f"{str(mine[0].get('sha256'))[:16]}… of {mine[0]['path']}: this is not the "
                                       "figure the sidecar vouches for"))
    if "digest" not in record:
        problems.append(("UNKNOWN", "the sidecar carries no digest (written before lara recorded one, or edited): "
                                    "its completeness cannot be checked"))
    elif record.get("digest_covers") == DIGEST_COVERS:
        if record["digest"] != digest(record):
            problems.append(("BROKEN", "the sidecar does not match its digest: it was edited after the figure was "
                                       "drawn"))
    elif record["digest"] != digest(record, legacy=True):
        problems.append(("BROKEN", "the sidecar's trail does not match its digest: it was edited after the figure "
                                   "was drawn"))
    else:
        problems.append(("UNKNOWN", "an older sidecar: its digest covers the figure, inputs and trail only, not its "
                                    "caption values, rule, params, seeds or code version; redraw the figure "
                                    "(snakemake --forcerun RULE) for a complete check"))
    listed = {e["path"] for e in record["trail"]}
    needed = [(p, "the figure") for p in record["inputs"]]
    needed += [(p, e["path"]) for e in record["trail"] for p in e.get("inputs") or []]
    for path, user in needed:
        if path not in listed:
            problems.append(("BROKEN", f"{path}: an input of {user} with no entry in the trail (an entry was removed)"))
    missing = 0
    for e in record["figure"] + record["trail"]:
        if e.get("rewritten_after_job"):
            problems.append(("UNKNOWN", f"{e['path']}: was written after the job that made it finished (a step rerun "
                                        "by hand, or a file copied in): its job's record does not describe it"))
        if e.get("origin") == "unknown":
            problems.append(("UNKNOWN", f"{e['path']}: no Snakemake record of the job that made it when the figure "
                                        "was drawn (.snakemake/metadata missing); its origin is unknown"))
        if e.get("sha256") is None:
            problems.append(("UNKNOWN", f"{e['path']}: no hash recorded; it cannot be checked"))
            continue
        p = root / e["path"]
        if not p.exists():
            missing += 1
            problems.append(("BROKEN", f"{e['path']}: missing under {root} (recorded sha256 {e['sha256'][:16]}…)"))
            continue
        now = sha256_path(p)
        if now != e["sha256"]:
            problems.append(("BROKEN", f"{e['path']}: sha256 {now[:16]}… no longer matches the recorded "
                                       f"{e['sha256'][:16]}…"))
    if missing and missing == sum(1 for e in record["figure"] + record["trail"] if e.get("sha256")):
        problems.append(("BROKEN", f"every recorded file is missing under {root}: the paths are relative to the "
                                   "workflow directory; run lara trail there or pass --root WORKFLOW_DIR"))
    return problems


def workflow_root(side: Path, record: dict) -> Path:
    """The directory a sidecar's relative paths start from, found from where the sidecar lies: its
    figure was recorded as ``results/EXP/figures/NAME.png`` beside it, so the root is that many folders
    up. The current directory when the layout does not say (a sidecar moved elsewhere)."""
    recorded = Path(record["figure"][0]["path"]) if record["figure"] else None
    here = side.resolve().parent
    if recorded is None or recorded.is_absolute():
        return Path(".")
    parts = recorded.parent.parts
    if not parts:
        return here
    if here.parts[-len(parts):] == parts:
        return Path(*here.parts[:-len(parts)])
    return Path(".")


def param_name(recorded: str) -> tuple[str, str]:
    """A job's param as Snakemake records it (the repr of its value; names are not recorded), named by
    the form every rule of this workflow gives it: ``code`` (``step_code``: the 16-hex hash of the step's
    modules), ``settings`` (``step_settings``: the JSON a rule hands its step), ``options`` (flags a rule
    adds, ``--max-prompts 5``), else ``param``."""
    import ast
    import re

    try:
        value = ast.literal_eval(recorded)
    except (ValueError, SyntaxError):
        value = recorded
    text = value if isinstance(value, str) else recorded
    if re.fullmatch(r"[0-9a-f]{16}", text):
        return "code", f"{text} (hash of the step's source)"
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        return "settings", text
    if text.startswith("--"):
        return "options", text
    return "param", text


def format_trail(record: dict) -> str:
    lines = [f"figure: {', '.join(f['path'] for f in record['figure'])}",
             f"  drawn by rule {record['rule']} on {record['host']} ({record['device']}) at {record['created']}",
             f"  code: {json.dumps(record['code'])}",
             f"  software: {', '.join(f'{k} {v}' for k, v in record['software'].items() if v)}",
             f"  params: {json.dumps(record['params'])}"]
    table = (record.get("shows") or {}).get("settings_table")
    if table:
        sha = next((e.get("sha256") for e in record["trail"] if e["path"] == table), None)
        lines.append(f"  made with the settings in {table} (sha256 {str(sha)[:16]}…): every resolved config value "
                     "and where it came from")
    lines.append("upstream (nearest first):")
    for e in record["trail"]:
        made = (f"rule {e['rule']}" if e.get("rule") else "origin unknown (no Snakemake record)"
                if e.get("origin") == "unknown" else "source (not made by this workflow)")
        lines.append(f"  {e['path']}  [{made}]  sha256 {str(e.get('sha256'))[:16]}…")
        if e.get("seed") is not None:
            lines.append(f"      seed {e['seed']}")
        for p in e.get("params") or []:
            name, value = param_name(p)
            lines.append(f"      {name}: {value[:160]}")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    parser.add_argument("figure", help="a figure (PNG/PDF) or its .provenance.json sidecar")
    parser.add_argument("--root", default=None,
                        help="the workflow directory the recorded paths are relative to (default: found from "
                             "where the sidecar lies)")
    parser.add_argument("--quiet", action="store_true", help="only the verdict")


def run(args) -> None:
    fig = Path(args.figure)
    given = None if fig.name.endswith(SUFFIX) else fig
    side = fig if given is None else sidecar_path(fig)
    if not side.is_file():
        raise DataError(f"{side}: no provenance sidecar for {args.figure}")
    record = read_sidecar(side)
    root = Path(args.root) if args.root is not None else workflow_root(side, record)
    if not args.quiet:
        print(format_trail(record))
    problems = verify(record, root, figure=given)
    n = len(record["figure"]) + sum(1 for e in record["trail"] if e.get("sha256"))
    if problems:
        for kind, message in problems:
            print(f"PROVENANCE {kind}: {message}")
        kinds = {k for k, _ in problems}
        print(f"provenance {'broken' if 'BROKEN' in kinds else 'unknown'}: {len(problems)} problem(s) "
              f"in {side}")
        raise SystemExit(1)
    asked = f"; {given.name} is the figure it recorded" if given is not None else ""
    print(f"provenance holds: all {n} recorded hashes match the files on disk, the sidecar matches its digest{asked}")
