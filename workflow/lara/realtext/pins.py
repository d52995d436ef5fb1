"""The pinned inputs of the real-text experiment: one reader of ``files.tsv`` (shipped with the package;
``config/real-text/files.tsv`` links to it) and the check that a file is the pinned one."""

from __future__ import annotations

import csv
import functools
from dataclasses import dataclass
from pathlib import Path

PINS_FILE = Path(__file__).resolve().parent / "files.tsv"
COLUMNS = ("package", "version", "file", "sha256", "source", "use")


@dataclass(frozen=True)
class Pin:
    package: str
    version: str
    file: str  # a wheel's name, a path inside the installed package, or "-" (pip checks a platform wheel itself)
    sha256: str  # "-" where ``file`` is "-"
    source: str
    use: str


@functools.cache
def pins(path: Path = PINS_FILE) -> tuple[Pin, ...]:
    """Every row of the pins file ('#' lines are comments), checked: the header, and a 64-hex sha256 for every file."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip() and not line.startswith("#")]
    rows = list(csv.reader(lines, delimiter="\t"))
    if not rows or tuple(rows[0]) != COLUMNS:
        raise ValueError(f"{path}: the header must be {' '.join(COLUMNS)}, got {rows[0] if rows else 'nothing'}")
    out = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != len(COLUMNS):
            raise ValueError(f"{path}: row {number} has {len(row)} columns, not {len(COLUMNS)}")
        pin = Pin(*row)
        if pin.file != "-" and (len(pin.sha256) != 64 or any(c not in "0123456789abcdef" for c in pin.sha256)):
            raise ValueError(f"{path}: row {number} ({pin.file}): {pin.sha256!r} is not a sha256")
        out.append(pin)
    return tuple(out)


def pin(package: str, file: str | None = None) -> Pin:
    """The pin of ``package`` (its row whose file is ``file``; without ``file``, its only or first row)."""
    rows = [p for p in pins() if p.package == package and (file is None or p.file == file)]
    if not rows:
        raise KeyError(f"{PINS_FILE}: no pin for {package}{'' if file is None else f' {file}'}")
    return rows[0]


def wheel_pin(package: str) -> Pin:
    """The pin of ``package``'s wheel (the row whose file ends in .whl)."""
    rows = [p for p in pins() if p.package == package and p.file.endswith(".whl")]
    if not rows:
        raise KeyError(f"{PINS_FILE}: no wheel pinned for {package}")
    return rows[0]


def version_mismatches(packages) -> list[tuple[str, str, str]]:
    """(package, installed version, pinned version) of each of ``packages`` installed at a version not its pin."""
    from importlib.metadata import version

    return [(p, version(p), pin(p).version) for p in packages if version(p) != pin(p).version]


def check_sha256(path: str | Path, expected: Pin, what: str, data: bytes | None = None, why: str = "") -> str:
    """The sha256 of ``path`` (of ``data``, its bytes as read once, when given), refused (a ConfigError naming the
    file, both hashes and the pin's source, then ``why``) unless it is the pinned one."""
    import hashlib

    from lara.config import ConfigError
    from lara.io import sha256_file

    got = sha256_file(path) if data is None else hashlib.sha256(data).hexdigest()
    if got != expected.sha256:
        raise ConfigError(f"{what} {path}: sha256 {got} is not the pinned {expected.sha256} of {expected.package} "
                          f"{expected.version} {expected.file} ({PINS_FILE.name}; from {expected.source}){why}")
    return got


def installed_files(package: str, scorer: str, names) -> dict[str, Path]:
    """The files ``names`` of the installed ``package`` (name -> path), found through its distribution's file list
    (the package's own Python code is never imported); a missing package or file is refused, naming the ``scorer``
    that needs it and the pinned version to install."""
    from importlib.metadata import PackageNotFoundError, distribution

    from lara.config import ConfigError

    try:
        dist = distribution(package)
    except PackageNotFoundError:
        raise ConfigError(f"the {scorer} scorer needs the {package} package (pip install {package}=="
                          f"{pin(package).version}; pyproject.toml pins it)") from None
    listed = {str(f): f for f in dist.files or ()}
    out = {}
    for name in names:
        if name not in listed:
            raise ConfigError(f"{package} {dist.version}: {name} is not in the distribution's file list")
        out[name] = Path(dist.locate_file(listed[name]))
        if not out[name].is_file():
            raise ConfigError(f"{package} {dist.version} lists {name}, but {out[name]} is not a file")
    return out
