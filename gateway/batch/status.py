"""A batch's statuses and the API's objects (pure).

``validating`` → ``in_progress`` → ``finalizing`` → ``completed``; ``failed`` when its
file does not make a batch; ``cancelling`` → ``cancelled`` when asked; ``expired`` at the
end of its window. What finished before a cancel or the window's end is kept.
"""

from __future__ import annotations

from typing import Any

from llmgw_core.refused import Refused

VALIDATING, IN_PROGRESS, FINALIZING = "validating", "in_progress", "finalizing"
COMPLETED, FAILED, EXPIRED = "completed", "failed", "expired"
CANCELLING, CANCELLED = "cancelling", "cancelled"
ENDED = frozenset({COMPLETED, FAILED, EXPIRED, CANCELLED})
# Where each status may go next.
NEXT: dict[str, frozenset[str]] = {
    VALIDATING: frozenset({IN_PROGRESS, FAILED, CANCELLING, EXPIRED}),
    IN_PROGRESS: frozenset({FINALIZING, CANCELLING, EXPIRED}),
    FINALIZING: frozenset({COMPLETED}),
    CANCELLING: frozenset({CANCELLED}),
}
# The stamp a status sets.
STAMP = {IN_PROGRESS: "in_progress_at", FINALIZING: "finalizing_at", COMPLETED: "completed_at",
         FAILED: "failed_at", EXPIRED: "expired_at", CANCELLING: "cancelling_at",
         CANCELLED: "cancelled_at"}  # fmt: skip
WINDOWS = {"24h": 24 * 3600}
# Kept with a batch for the runner and the console, never shown by the API.
PRIVATE = ("owner", "key", "key_digest", "line_errors", "held")
# How much of an error's message a batch keeps for the console (per kind of error).
MESSAGE_KEPT = 300


class StatusRefused(Refused, ValueError):
    """A move a batch's status does not allow."""


def move(batch: dict[str, Any], to: str, now: int) -> dict[str, Any]:
    """``batch`` with status ``to`` (stamped at ``now``); ``StatusRefused`` when not allowed."""
    at = batch["status"]
    if to not in NEXT.get(at, frozenset()):
        raise StatusRefused(f"a batch that is {at} cannot become {to}")
    moved = dict(batch, status=to)
    moved[STAMP[to]] = now
    return moved


def new(batch_id: str, *, input_file_id: str, endpoint: str, window: str, metadata: Any,
        now: int, total: int, owner: str, key: str, key_digest: str) -> dict[str, Any]:  # fmt: skip
    return {
        "id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
        "input_file_id": input_file_id, "completion_window": window, "status": VALIDATING,
        "output_file_id": None, "error_file_id": None, "created_at": now,
        "in_progress_at": None, "expires_at": now + WINDOWS[window], "finalizing_at": None,
        "completed_at": None, "failed_at": None, "expired_at": None, "cancelling_at": None,
        "cancelled_at": None, "request_counts": {"total": total, "completed": 0, "failed": 0},
        "metadata": metadata, "owner": owner, "key": key, "key_digest": key_digest,
    }  # fmt: skip


def shown(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch as the API shows it."""
    return {k: v for k, v in batch.items() if k not in PRIVATE}


def metadata(value: Any) -> dict[str, str] | None:
    """The API's metadata (at most 16 string pairs, keys to 64, values to 512 characters);
    ``ValueError`` saying what is wrong."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > 16:
        raise ValueError("metadata must be an object of at most 16 pairs")
    for k, v in value.items():
        if not isinstance(v, str) or len(k) > 64 or len(v) > 512:
            raise ValueError("metadata's keys are strings of up to 64 characters, its values "
                             "strings of up to 512")  # fmt: skip
    return dict(value)


def output_line(line_id: str, custom_id: str, status: int | None, body: Any,
                error: dict[str, str] | None, request_id: str = "") -> dict[str, Any]:  # fmt: skip
    """One line of an output or error file, in the API's format."""
    response = None if status is None else {"status_code": status, "request_id": request_id,
                                            "body": body}  # fmt: skip
    return {"id": line_id, "custom_id": custom_id, "response": response, "error": error}


def error_of(out: dict[str, Any]) -> tuple[str, str]:
    """An error line's kind (the gateway's error code, else its status) and message."""
    if out.get("error"):
        return str(out["error"].get("code") or "error"), str(out["error"].get("message") or "")
    response = out.get("response") or {}
    body = response.get("body")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code") or error.get("type") or f"HTTP {response.get('status_code')}"
        return str(code), str(error.get("message") or "")
    return f"HTTP {response.get('status_code')}", str(body or "")[:MESSAGE_KEPT]


def count_error(kinds: dict[str, Any] | None, out: dict[str, Any]) -> dict[str, Any]:
    """``kinds`` (a batch's ``line_errors``: each kind's count and first message) with one
    more error line counted."""
    code, message = error_of(out)
    kinds = dict(kinds or {})
    seen = kinds.get(code) or {"count": 0, "message": message[:MESSAGE_KEPT]}
    kinds[code] = {**seen, "count": seen["count"] + 1}
    return kinds


# How many of a failed batch's problems the console lists.
TOLD_FAILURES = 20


def progress(batch: dict[str, Any], now: float) -> dict[str, Any]:
    """What the Batches page shows of a batch: lines done of the total, the share done,
    lines a second since it began (None before it began), its error lines by kind (most
    first: kind, count, the first one's message) and why it failed, if it did."""
    counts = batch["request_counts"]
    done = counts["completed"] + counts["failed"]
    total = counts["total"]
    began = batch.get("in_progress_at")
    ended = next((batch[STAMP[s]] for s in (COMPLETED, CANCELLED, EXPIRED, FAILED)
                  if batch.get(STAMP[s])), None)  # fmt: skip
    seconds = ((ended or now) - began) if began else 0
    return {"done": done, "total": total, "percent": round(100 * done / total) if total else 0,
            "rate": round(done / seconds, 1) if seconds > 0 else None,
            "errors": counts["failed"], "ended": batch["status"] in ENDED,
            "held": "" if batch["status"] in ENDED else batch.get("held", ""),
            "error_kinds": sorted(((k, v["count"], v["message"])
                                   for k, v in (batch.get("line_errors") or {}).items()),
                                  key=lambda e: (-e[1], e[0])),
            "failures": [(f"line {e['line']}: " if e.get("line") else "") + e.get("message", "")
                         for e in ((batch.get("errors") or {}).get("data") or [])
                         ][:TOLD_FAILURES]}  # fmt: skip
