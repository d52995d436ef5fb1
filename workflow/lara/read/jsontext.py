"""Parsing JSON text without losing a key: one hook for the records the reader reads (lara.read.files) and the
settings a command is handed (lara.settings). No lara imports (the settings import it before anything else)."""

from __future__ import annotations


def no_duplicate_keys(where: str, error: type[Exception], shown=repr):
    """A ``json.loads`` ``object_pairs_hook`` that refuses a key given twice in one object (``json.loads`` would keep
    the last silently), raising ``error`` naming ``where`` and the key (as ``shown`` writes it)."""

    def hook(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise error(f"{where}: the key {shown(key)} is given twice in one JSON object; the second would "
                            "silently replace the first")
            seen.add(key)
        return dict(pairs)

    return hook


def cache_file(path) -> dict | None:
    """A cache's JSON object (one the package writes for itself, never a step's input), or None where it cannot be
    trusted whole: missing, unreadable, not an object, or with a key given twice. A cache is only ever a shortcut,
    so None means "compute again", never an error."""
    import json
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"),
                          object_pairs_hook=no_duplicate_keys(str(path), ValueError))
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None
