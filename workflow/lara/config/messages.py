"""Messages that name the problem: an unknown key that looks like a known one (a Cyrillic letter, a trailing
space, a typo), and the layer (a config file, ``--config``) that set the value a message is about."""

from __future__ import annotations

import difflib
import unicodedata

# letters of other scripts that look like Latin ones (the ones a keyboard layout or a copied text slips in)
LOOKALIKES = str.maketrans({
    "а": "a", "в": "b", "е": "e", "к": "k", "м": "m", "н": "h", "о": "o", "р": "p", "с": "c", "т": "t", "у": "y",
    "х": "x", "і": "i", "ј": "j", "ѕ": "s", "ԁ": "d", "ӏ": "l", "ԛ": "q", "ԝ": "w",
    "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M", "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X",
    "α": "a", "ε": "e", "ι": "i", "κ": "k", "ν": "v", "ο": "o", "ρ": "p", "τ": "t", "υ": "u", "χ": "x",
    "‐": "-", "‑": "-", "–": "-", "—": "-", "＿": "_",
})
INVISIBLE = {"\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad"}


def _plain(key: str) -> str:
    """``key`` as it was meant: lookalike letters mapped to Latin, invisible characters and padding removed."""
    text = unicodedata.normalize("NFKC", key).translate(LOOKALIKES)
    return "".join(ch for ch in text if ch not in INVISIBLE).strip()


def _odd_characters(key: str) -> list[str]:
    """The characters of ``key`` that a configuration key never has, each with its position and Unicode name."""
    out = []
    for i, ch in enumerate(key):
        if ch.isascii() and (ch.isalnum() or ch in "_-."):
            continue
        name = unicodedata.name(ch, "a control character" if not ch.isprintable() else "unnamed")
        out.append(f"{ch!r} (U+{ord(ch):04X} {name}) at position {i}")
    return out


def unknown_key_hint(key, known) -> str:
    """What an unknown key probably is: a known key written with lookalike or invisible characters or padding
    (the characters shown), or the closest known key (a typo); empty when nothing is close."""
    if not isinstance(key, str) or not known:
        return ""
    known = [k for k in known if isinstance(k, str)]
    plain = _plain(key)
    if plain in known and plain != key:
        odd = _odd_characters(key)
        what = "; ".join(odd[:4]) + (f" and {len(odd) - 4} more" if len(odd) > 4 else "")
        return f"{key!r} is {plain!r} written with {what}: write {plain}"
    swapped = [k for k in known if sorted(k) == sorted(plain.lower())]  # two letters swapped (tua for tau)
    close = swapped[:1] or difflib.get_close_matches(plain.lower(), known, n=1, cutoff=0.75)
    return f"did you mean {close[0]}?" if close else ""


def problem_origin(layer_list, problem: str) -> str:
    """Where the keys a problem line names were set: `` (set in FILE)`` when one layer (a file, ``--config``) set
    them all, else each key with its layer; empty when no layer sets any (schema and step defaults)."""
    import re

    if "(set in " in problem:
        return ""
    found: dict[str, str] = {}
    for key in re.findall(r"(?<![\w.])([a-z_][a-z0-9_]*(?:\.[\w]+|\[\d+\])+)", problem):
        path = [int(p) if p.isdigit() else p for p in re.split(r"\.|\[|\]", key) if p]
        origin = origin_of(layer_list, path)
        if origin and key not in found:
            found[key] = origin
    if not found:
        return ""
    if len(set(found.values())) == 1:
        return f" (set in {next(iter(found.values()))})"
    return " (" + "; ".join(f"{key} set in {origin}" for key, origin in found.items()) + ")"


def origin_of(layer_list, path) -> str | None:
    """The origin (a config file, ``--config``) of the last layer that sets the key at ``path`` (keys and list
    indices; a list is set whole, so its items' origin is the list's), or None: no layer sets it."""
    if not layer_list:
        return None
    for origin, data in reversed(layer_list):
        node, found = data, False
        for part in path:
            if isinstance(node, dict) and part in node:
                node, found = node[part], True
            elif isinstance(node, list) and found:
                break  # the list was set here, whole (its items are named by index or by name)
            else:
                found = False
                break
        if found:
            return origin
    return None
