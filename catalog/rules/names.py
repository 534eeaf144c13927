"""Names a person reads and a URL, a header or a metric carries: one line of visible text.

A model's name, its aliases, its adapters' names and an external model's name are sent as
URL paths, HTTP headers, log lines and metric labels; a line break or an escape there
broke pages (500), dropped a chat's connection and split ``/metrics``' lines (issue 17).
"""

from __future__ import annotations

import unicodedata

# Unicode categories refused in a name: control characters (Cc: CR, LF, ESC, NUL, C1),
# format characters (Cf: zero-width spaces and joiners, bidirectional overrides that
# make a name read as another, the BOM), line and paragraph separators (Zl, Zp) and
# lone surrogates (Cs).
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_KINDS = {
    "Cc": "a control character",
    "Cf": "an invisible formatting character",
    "Zl": "a line separator",
    "Zp": "a paragraph separator",
    "Cs": "a lone surrogate",
}


def bad_character(text: str) -> str | None:
    """Return what the first refused character of ``text`` is, for a person, or None."""
    for c in text:
        category = unicodedata.category(c)
        if category in REFUSED_CATEGORIES:
            kind = "a line break" if c in "\r\n" else _KINDS[category]
            return f"{kind} (U+{ord(c):04X})"
    return None


def shown(text: str) -> str:
    """Return ``text`` with each refused character written as \\uXXXX, safe to print."""
    return "".join(
        f"\\u{ord(c):04x}" if unicodedata.category(c) in REFUSED_CATEGORIES else c for c in text
    )
