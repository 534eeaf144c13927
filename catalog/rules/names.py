"""Names a person reads and a URL, a header or a metric carries: one line of visible text.

A model's name, its aliases, its adapters' names and an external model's name are sent as
URL paths, HTTP headers, log lines and metric labels; a line break or an escape there
broke pages (500), dropped a chat's connection and split ``/metrics``' lines.

``name_problem`` is the grammar of a name a page or an API path is built from (a model,
an alias, an adapter, a node, an owner): the model ids OpenAI clients send
(``meta-llama/Llama-3.1-8B-Instruct``, ``qwen2.5:7b``, ``gpt-4o-mini``, a federation's
``PEER/MODEL``), so ``/`` separates parts, and every part is reachable by its URL.
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


# The longest name: the database columns hold 200 characters.
MAX_NAME = 200
# Characters a URL path reads as something else: the query, the fragment, an escape,
# a Windows path separator.
URL_CHARACTERS = "?#%\\"
# The words a route puts after a name (``models/<name>/edit/``, ``nodes/<name>/drain/``):
# a name with a slash may not end in one, or its own page would be another's action.
ROUTE_WORDS = frozenset(
    {
        "address", "bench", "cancel", "changes", "check", "cordon", "delete", "demand",
        "drain", "edit", "fetch", "health", "mirror", "panel", "promote", "prompt",
        "prompt.txt", "release", "revert",
        "roll", "rollback", "scale", "schedule", "uncordon", "update", "update-check",
        "wake",
    }
)  # fmt: skip


def name_problem(text: str) -> str | None:
    """Return why ``text`` is not a name a page or an API path can carry, or None.

    A name is 1 to 200 visible characters with no space; ``/`` separates parts (none
    empty, none ``.`` or ``..``, so no leading, trailing or double slash); no ``?``,
    ``#``, ``%`` or ``\\``; and a name with a slash does not end in a word a route puts
    after a name (``edit``, ``delete``, ...). The reason says what to change.
    """
    if not text:
        return "is empty: give a name"
    if len(text) > MAX_NAME:
        return f"is {len(text)} characters long: a name is at most {MAX_NAME}"
    if bad := bad_character(text):
        return f"holds {bad}: a name is one line of visible characters; remove it"
    for c in text:
        if c.isspace() or unicodedata.category(c) == "Zs":
            return f"holds a space (U+{ord(c):04X}): a name has none; write - or _ instead"
        if c in URL_CHARACTERS:
            return (
                f'holds "{c}", which a URL reads as something else: a name has no '
                "?, #, % or \\; remove it"
            )
    parts = text.split("/")
    if text.startswith("/") or text.endswith("/"):
        return "starts or ends with /: / only separates parts (org/model); remove it"
    if "" in parts:
        return "holds //: / separates parts, none of them empty; write one /"
    if "." in parts or ".." in parts:
        return (
            'has a part that is "." or "..", which a browser and a path read as a '
            "directory step: rename that part"
        )
    if len(parts) > 1 and parts[-1] in ROUTE_WORDS:
        return (
            f'ends in /{parts[-1]}, the address of an action on "{"/".join(parts[:-1])}": '
            "a name with a slash does not end in "
            + ", ".join(sorted(ROUTE_WORDS))
            + "; rename the last part"
        )
    return None
