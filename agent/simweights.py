"""What a sim engine's weights file makes it answer: its quality, as an update sees it.

The sim engine makes its answers up, so "weights" for it are a small JSON file saying how
good the model is. An update (docs/updates.md) moves a model to new weights, runs the
eval gate on them and canaries them; with sim engines the file decides how each step
goes: "worse" weights fail the gate, "failing" ones are rolled back by the canary,
"better" ones are promoted. The file, one JSON object::

    {"llmgw-sim-weights": 1, "name": "v2", "arithmetic": 0.95, "json_format": 1.0,
     "error_rate": 0.0}

- ``arithmetic``: the share of arithmetic questions ("What is 17 + 25?") answered with
  the right number; which ones is decided by the question, so the same question gets the
  same answer every time (the shipped ``arithmetic`` suite scores close to it);
- ``json_format``: the share of requests for "a JSON object with the keys "a" and "b""
  answered with exactly such an object (the others get prose);
- ``error_rate``: the share of generation requests answered 500, spread evenly (with 0.5,
  every second one), so a retry after a failure is answered;
- ``name``: what the sim says it is (``/props``).

Every figure is 0 to 1 and defaults to 1 (0 for ``error_rate``). A file that is not such
an object (a real model's GGUF given to the sim) is no sim weights: the sim answers as a
plain sim. One that says it is (the ``llmgw-sim-weights`` key) but holds a wrong value is
refused with the key and what to write. A folder is looked into for ``sim-weights.json``
(a mirrored repository).

Standard library only; no Django (the sim runs on nodes).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

MARKER = "llmgw-sim-weights"
FILE_NAME = "sim-weights.json"
FIGURES = ("arithmetic", "json_format", "error_rate")
KEYS = (MARKER, "name", *FIGURES)
# A weights file is small; anything larger is a real model's file, not read whole.
MAX_BYTES = 64 * 1024

# "What is 17 + 25?", "what is -3 * 4", "What is 9 - 12 ?"
_ARITHMETIC = re.compile(r"what is\s+(-?\d{1,12})\s*([+\-*x×])\s*(-?\d{1,12})\s*\??", re.I)
# 'a JSON object with the keys "name" and "year"' (the key list up to the end of the line)
_JSON_ASK = re.compile(r"JSON object with the keys?\s+([^\n]*)", re.I)
_QUOTED = re.compile(r'"([^"\\]{1,64})"')


class WeightsFileError(ValueError):
    """A sim weights file with a wrong value: the message says where and what to write."""


@dataclass(frozen=True)
class Weights:
    """How good a sim model is (see the module's docstring)."""

    arithmetic: float = 1.0
    json_format: float = 1.0
    error_rate: float = 0.0
    name: str = ""


def parse(raw: bytes, where: str = FILE_NAME) -> Weights | None:
    """Return the weights a file's bytes hold; None when they are no sim weights file.

    Raises:
        WeightsFileError: the file says it is sim weights but a value is wrong.
    """
    if raw.lstrip()[:1] != b"{" or len(raw) > MAX_BYTES:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(data, dict) or MARKER not in data:
        return None
    if data[MARKER] != 1:
        raise WeightsFileError(f'{where}: "{MARKER}" is {data[MARKER]!r}; write 1')
    unknown = sorted(set(data) - set(KEYS))
    if unknown:
        raise WeightsFileError(
            f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(KEYS)}"
        )
    figures: dict[str, float] = {}
    for key in FIGURES:
        if key not in data:
            continue
        value = data[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or not 0 <= value <= 1
        ):
            raise WeightsFileError(f"{where}: {key} is {value!r}; write a number from 0 to 1")
        figures[key] = float(value)
    name = data.get("name", "")
    if not isinstance(name, str) or len(name) > 200:
        raise WeightsFileError(f"{where}: name is {name!r}; write a short string")
    return Weights(name=name, **figures)


def load(path: str | os.PathLike[str]) -> Weights | None:
    """Return the weights at a path (a file, or a folder holding ``sim-weights.json``).

    None when there is nothing there that is sim weights.

    Raises:
        WeightsFileError: a sim weights file with a wrong value.
        OSError: the file cannot be read.
    """
    target = Path(path)
    if target.is_dir():
        target = target / FILE_NAME
        if not target.is_file():
            return None
    if not target.is_file():
        return None
    with target.open("rb") as f:
        raw = f.read(MAX_BYTES + 1)
    return parse(raw, str(target))


def _unit(*parts: str) -> float:
    """A number in [0, 1) that depends only on ``parts``: the same in every process."""
    digest = hashlib.blake2b("\x00".join(parts).encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def answer(weights: Weights, text: str) -> str | None:
    """Return the answer to a question the weights know, or None for any other text.

    An arithmetic question gets its number (right, or off by 1 to 9); a request for a
    JSON object with named keys gets such an object (or prose when it is got wrong).
    """
    if m := _ARITHMETIC.search(text):
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        value = a + b if op == "+" else a - b if op == "-" else a * b
        if _unit("arithmetic", m.group(0).lower()) < weights.arithmetic:
            return str(value)
        return str(value + 1 + int(_unit("off", m.group(0)) * 9))
    if m := _JSON_ASK.search(text):
        keys = _QUOTED.findall(m.group(1))
        if not keys:
            return None
        if _unit("json", m.group(0)) < weights.json_format:
            return json.dumps({k: f"{k} value" for k in keys})
        return "Sure! " + ", ".join(f"{k} is something" for k in keys) + "."
    return None


def fails(weights: Weights, n: int) -> bool:
    """Return whether the ``n``-th generation request (from 1) is answered 500.

    Spread evenly: over any run of requests, the failures are the error rate's share of
    them, rounded, and with a rate of at most one half no two come in a row.
    """
    rate = weights.error_rate
    return rate > 0 and math.floor(n * rate) != math.floor((n - 1) * rate)
