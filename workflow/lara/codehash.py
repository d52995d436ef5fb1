"""Code hashes that make an edited step rerun, read off the import graph.

A rule names its step (a ``lara`` command); :func:`step_code` hashes the source of that
step's module and of every ``lara`` module it imports, directly or through others, at
module level or inside a function, plus the ``__init__.py`` of every package on the way
(Python runs those on import). Each source is hashed as its syntax tree without
docstrings, so comments, docstrings and formatting change nothing, while any change to
what the code does changes the hash of every step that can run it. No module is
imported: the sources are parsed, so reading every rule's hash costs milliseconds.

The hash depends on the Python version's syntax-tree layout: a new Python minor version
may change every hash once (and so rerun everything), never silently keep a stale result.

Parsing every module takes about two seconds, at every start of Snakemake (a dry run included). What a parse
yields is kept in a cache file (``$XDG_CACHE_HOME/lara/``, else ``~/.cache/lara/``, one per Python version),
keyed by each module's name and the digest of its file's bytes: an edited, added or moved module is parsed
again, so the cache never answers for code it has not read (a lost or unwritable cache only costs the parse).
Past :data:`MAX_ENTRIES` entries (months of edits) a write keeps only those the writing process used.
"""

from __future__ import annotations

import ast
import atexit
import functools
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT_PACKAGE = "lara"
PACKAGE_DIR = Path(__file__).resolve().parent


def module_file(name: str) -> Path | None:
    """The source file of a ``lara`` module or package (None if there is none)."""
    parts = name.split(".")
    if parts[0] != ROOT_PACKAGE:
        return None
    base = PACKAGE_DIR.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_package(name: str) -> bool:
    f = module_file(name)
    return f is not None and f.name == "__init__.py"


def _parents(name: str) -> list[str]:
    """``lara.a.b`` -> [``lara``, ``lara.a``]: the packages Python initialises first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _absolute(name: str, node: ast.ImportFrom) -> str:
    """The module an import-from names, with relative imports resolved against ``name``."""
    if not node.level:
        return node.module or ""
    package = name if _is_package(name) else name.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _source(name: str) -> Path:
    """The source file of module ``name``, or ValueError: not a module of this package."""
    path = module_file(name)
    if path is None:
        raise ValueError(f"{name}: not a module of the {ROOT_PACKAGE} package (no source under {PACKAGE_DIR})")
    return path


@functools.cache
def _read(name: str) -> tuple[frozenset[str], str]:
    """One parse of module ``name``: every module its imports may name (``from lara.read import files``: lara.read
    and lara.read.files), and what it does as text (its syntax tree without docstrings, positions or comments)."""
    path = _source(name)
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = _absolute(name, node)
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return frozenset(found), ast.dump(tree, annotate_fields=False, include_attributes=False)


# ---------------------------------------------------------------------------------------------
# The cache of what the parses yield (the module docstring)


@functools.cache
def _key(name: str) -> str:
    """Module ``name`` as the cache knows it: its name, whether it is a package, and its file's digest."""
    path = _source(name)
    return f"{name}:{path.name == '__init__.py'}:{hashlib.sha256(path.read_bytes()).hexdigest()}"


def _cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lara" / f"codehash-{sys.implementation.cache_tag}.json"


@functools.cache
def _cache() -> dict:
    from lara.read.jsontext import cache_file

    data = cache_file(_cache_file()) or {}
    if isinstance(data.get("imports"), dict) and isinstance(data.get("code"), dict):
        return data
    return {"imports": {}, "code": {}}


def _remember(section: str, key: str, value) -> None:
    """Add one entry to the cache; the file is written once, when the process ends."""
    _write_at_exit()
    _cache()[section][key] = value


@functools.cache
def _write_at_exit() -> None:
    atexit.register(_write)


_USED: dict[str, set] = {"imports": set(), "code": set()}  # the entries this process read or wrote
MAX_ENTRIES = 20_000  # past this many (months of edits), a write keeps only this process's entries


def _write() -> None:
    """Write the cache whole, atomically (a concurrent reader sees the old file or the new one)."""
    cache = _cache()
    if sum(len(v) for v in cache.values()) > MAX_ENTRIES:
        cache = {section: {k: v for k, v in entries.items() if k in _USED[section]}
                 for section, entries in cache.items()}
    try:
        path = _cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".codehash-")
    except OSError:
        return  # an unwritable cache: the next start parses again
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(cache, f)
        os.replace(tmp, path)
    except OSError:
        Path(tmp).unlink(missing_ok=True)  # (the cache's path taken by a folder, say): nothing left behind


@functools.cache
def imports_of(name: str) -> frozenset[str]:
    """The ``lara`` modules that module ``name`` imports anywhere in its source."""
    key = _key(name)
    _USED["imports"].add(key)
    named = _cache()["imports"].get(key)
    if not (isinstance(named, list) and all(isinstance(m, str) for m in named)):  # none, or not one the cache wrote
        named = sorted(_read(name)[0])
        _remember("imports", key, named)
    return frozenset(m for m in named if module_file(m) is not None)


def normalised_source(name: str) -> str:
    """What a module does, as text: its syntax tree without docstrings, positions or comments."""
    return _read(name)[1]


@functools.cache
def closure(name: str) -> tuple[str, ...]:
    """``name`` and every ``lara`` module it can run: its imports (transitively) and the
    packages that contain each of them, sorted."""
    seen: set[str] = set()
    todo = [name]
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        todo.extend(imports_of(mod) | set(_parents(mod)))
    return tuple(sorted(seen))


@functools.cache
def modules_code(names: tuple[str, ...]) -> str:
    """Hash (16 hex digits) of the union of the import closures of ``names``."""
    mods = sorted(set().union(*(closure(n) for n in names)))
    key = hashlib.sha256("\n".join(_key(m) for m in mods).encode()).hexdigest()
    _USED["code"].add(key)
    code = _cache()["code"].get(key)
    if not (isinstance(code, str) and len(code) == 16 and all(ch in "0123456789abcdef" for ch in code)):
        h = hashlib.sha256()
        for mod in mods:
            h.update(mod.encode() + b"\0" + normalised_source(mod).encode() + b"\0")
        code = h.hexdigest()[:16]
        _remember("code", key, code)
    return code


def step_code(command: str, *also: str) -> str:
    """Hash of the code that ``lara COMMAND`` runs (see the module docstring), plus the modules
    ``also`` that it loads by name rather than by import (a named scorer's module)."""
    from lara.steps import COMMANDS

    if command not in COMMANDS:
        raise ValueError(f"unknown lara command {command!r}; known: {', '.join(COMMANDS)}")
    return modules_code((COMMANDS[command], *also))


def named_scorer_modules(*specs: str) -> list[str]:
    """The modules of the named scorers among ``specs`` (entry points of ``lara.scorers``), whose code
    a step that scores with them runs although it never imports them."""
    from lara.scorer_specs import named_scorers

    named = named_scorers()
    return sorted({named[s].module for s in specs if s in named})
