"""What makes two texts one prompt (or one response): :func:`prompt_key`. No lara imports, so every reader can use it
(lara.identity, lara.read) without importing the data steps."""

from __future__ import annotations

import unicodedata

# invisible characters that are not format characters (category Cf) but are ignorable by default (Unicode's
# Default_Ignorable_Code_Point): the combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian
# variation selectors, variation selectors (U+FE00-FE0F, U+E0100-E01EF), reserved U+FFF0-FFF8
_IGNORABLE = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x3164, 0xFFA0,
                        *range(0xFE00, 0xFE10), *range(0xFFF0, 0xFFF9), *range(0xE0100, 0xE01F0)])


def _visible(text: str) -> str:
    return "".join(ch for ch in text if unicodedata.category(ch) != "Cf" and ord(ch) not in _IGNORABLE)


def prompt_key(text: str) -> str:
    """What makes two prompts the same prompt: Unicode NFKC (composed, and compatibility forms such as
    full-width letters, ligatures and the ideographic space as their plain letters), no invisible characters
    (format characters, Unicode category Cf: zero-width space and joiners, word joiner, soft hyphen,
    byte-order mark, direction marks; and the other default-ignorable ones: variation selectors, the
    combining grapheme joiner, Hangul fillers), whitespace runs (no-break spaces included) collapsed to one
    space and trimmed. Case is kept: "Kill" and "kill" are two prompts. Deduplication, the splits'
    disjointness and prompt ids go by it."""
    text = _visible(unicodedata.normalize("NFKC", _visible(str(text))))
    return " ".join(unicodedata.normalize("NFC", text).split())


