"""A batch input file's lines, checked at upload and again against the batch's endpoint
(pure).

Each line is a JSON object ``{"custom_id": str, "method": "POST", "url": endpoint,
"body": {...}}``; ``custom_id`` unique in the file; ``url`` one of ``ENDPOINTS``; ``body.stream`` absent or
false (a line is answered whole, in the output file; OpenAI's Batch API refuses a streamed
line too). A problem
is told with its line number (1-based), so a client fixes the file without guessing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
# How many problems an answer names (the rest are counted).
TOLD = 20


@dataclass(frozen=True)
class Line:
    number: int  # 1-based
    custom_id: str
    url: str
    body: dict[str, Any]


class LinesError(ValueError):
    """A file whose lines do not make a batch; ``problems`` are ``(line, what)``."""

    def __init__(self, problems: list[tuple[int, str]], total: int | None = None) -> None:
        self.problems = problems
        self.total = len(problems) if total is None else total
        told = "; ".join(f"line {n}: {what}" for n, what in problems[:TOLD])
        more = self.total - min(len(problems), TOLD)
        super().__init__(
            f"The file has {self.total} bad line{'s' if self.total != 1 else ''}: {told}"
            + (f"; and {more} more" if more > 0 else "")
            + '. Each line is a JSON object {"custom_id": "...", "method": "POST", '
            f'"url": one of {", ".join(ENDPOINTS)}, "body": {{...}}}}.'
        )


def _one(number: int, text: str) -> Line | str:
    """The line, or what is wrong with it."""
    try:
        data = json.loads(text)
    except ValueError as error:
        return f"not JSON ({error.msg} at column {error.colno})"
    if not isinstance(data, dict):
        return "not a JSON object"
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "custom_id is missing or not a string"
    if len(custom_id) > 512:
        return "custom_id is longer than 512 characters"
    if data.get("method") != "POST":
        return 'method must be "POST"'
    url = data.get("url")
    if url not in ENDPOINTS:
        return f"url {url!r} is not one of {', '.join(ENDPOINTS)}"
    body = data.get("body")
    if not isinstance(body, dict):
        return "body is missing or not a JSON object"
    if not isinstance(body.get("model"), str) or not body["model"]:
        return "body.model is missing or not a string"
    if body.get("stream") not in (None, False):
        # As OpenAI's Batch API: a line is answered whole, in the output file.
        return "body.stream must be false or left out: a batch's lines are not streamed"
    return Line(number, custom_id, url, body)


def check(raw: bytes, max_lines: int) -> list[Line]:
    """The file's lines; ``LinesError`` naming every bad one (blank lines are skipped,
    as the API does; an empty file, or one past ``max_lines``, is refused)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw[: error.start].count(b"\n") + 1
        raise LinesError([(line, "not UTF-8")]) from None
    out: list[Line] = []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    counted = 0
    for number, part in enumerate(text.split("\n"), start=1):
        if not part.strip():
            continue
        counted += 1
        if counted > max_lines:
            raise LinesError([(number, f"the file has more than {max_lines} lines, the most "
                                       "one batch may hold (LLMGW_FILES_MAX_LINES)")])  # fmt: skip
        found = _one(number, part)
        if isinstance(found, str):
            problems.append((number, found))
            continue
        first = seen.setdefault(found.custom_id, number)
        if first != number:
            problems.append((number, f"custom_id {found.custom_id!r} is used by line {first} too"))
            continue
        out.append(found)
    if problems:
        raise LinesError(problems)
    if not out:
        raise LinesError([(1, "the file has no lines")])
    return out


def for_endpoint(lines: list[Line], endpoint: str) -> None:
    """Every line's url is the batch's ``endpoint``; else ``LinesError``."""
    problems = [(line.number, f"url {line.url} is not the batch's endpoint {endpoint}")
                for line in lines if line.url != endpoint]  # fmt: skip
    if problems:
        raise LinesError(problems)
