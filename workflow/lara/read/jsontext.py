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
