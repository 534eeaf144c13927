"""What each gateway process reports of its load, and the sum the reconciler scales on.

The report's format and where it is kept are the cluster's; the gateway writes it
(``gateway.records.loadreport``, once a second per process). A report is one process's now:

    {"process": "host:pid", "at": 1767000000.0, "edges": [5, 10, ...],
     "models": {"chat": {"in_flight": 3, "waiting": 0, "ttft": [0, 4, ...]}}}

``in_flight`` is the process's requests on the model's replicas (a mean over its last
seconds: a number, not always whole), ``waiting`` its
requests waiting for a replica of the model (scaled to zero, starting), and ``ttft`` the
counts of its answers' times to the first token over the last ``WINDOW`` seconds, in the
buckets ``edges`` (milliseconds; the last bucket is everything above).

Kept in Redis in production (``LLMGW_REDIS_URL``): each process's report under its own
key that expires after ``TTL`` seconds (a process that stops stops counting), listed in
one set, both under this cluster's prefix (``llmgw_core.rediskeys``: two clusters on one
Redis never scale on each other's load). Embedded, in this process's memory, with the same expiry. Every call to Redis
has ``LLMGW_REDIS_TIMEOUT_MS``; :func:`read` raises :class:`Unavailable` when Redis does
not answer, and the reconciler then holds every target where it is.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from redis import Redis

from cluster.scaling import Load, quantile_ms
from llmgw_core import rediskeys

TTL = 5  # seconds a report counts after it was written
WINDOW = 10  # seconds a report's TTFT counts cover
MAX_BYTES = 256 * 1024  # a report larger than this is not read

_lock = threading.Lock()
_local: dict[str, tuple[float, dict[str, Any]]] = {}  # process -> (expires, report)
_client: Any = None


def prefix() -> str:
    """Where this cluster's load reports live in Redis: a process's report under
    ``prefix() + process``, their index at ``prefix() + "processes"``."""
    return rediskeys.prefix() + "load:"


class Unavailable(Exception):
    """The reports could not be read (Redis did not answer in time)."""


def _timeout() -> float:
    return max(settings.LLMGW_REDIS_TIMEOUT_MS / 1000, 0.1)


def _redis() -> Any:
    global _client
    if _client is None:
        _client = Redis.from_url(
            settings.REDIS_URL, socket_timeout=_timeout(), socket_connect_timeout=_timeout()
        )
    return _client


def write(report: dict[str, Any]) -> None:
    """Keep one process's report for ``TTL`` seconds (raises on a Redis failure)."""
    process = str(report["process"])
    if settings.REDIS_URL:
        data = json.dumps(report, separators=(",", ":"))
        pipe = _redis().pipeline(transaction=False)
        where = prefix()
        pipe.set(where + process, data, ex=TTL)
        pipe.sadd(where + "processes", process)
        pipe.expire(where + "processes", TTL * 12)
        pipe.execute()
        return
    with _lock:
        _local[process] = (time.monotonic() + TTL, report)


def reports() -> list[dict[str, Any]]:
    """Every process's report still in force."""
    if settings.REDIS_URL:
        try:
            client, where = _redis(), prefix()
            processes = sorted(p.decode() for p in client.smembers(where + "processes"))
            if not processes:
                return []
            values = client.mget([where + p for p in processes])
            gone = [p for p, v in zip(processes, values, strict=True) if v is None]
            if gone:
                client.srem(where + "processes", *gone)
        except Exception as error:  # redis-py's errors, and an address that is none
            raise Unavailable(f"Redis did not answer: {error}") from error
        out = []
        for value in values:
            if value is None or len(value) > MAX_BYTES:
                continue
            try:
                out.append(json.loads(value))
            except ValueError:
                continue
        return out
    now = time.monotonic()
    with _lock:
        for process in [p for p, (expires, _) in _local.items() if expires <= now]:
            del _local[process]
        return [report for _, report in _local.values()]


def clear() -> None:
    """Forget every report kept in this process (tests)."""
    with _lock:
        _local.clear()


def _counts(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        return None
    return value


def total(items: list[dict[str, Any]]) -> dict[str, Load]:
    """The sum over every process's report, per model; malformed parts are left out."""
    sums: dict[str, dict[str, Any]] = {}
    edges: list[float] | None = None
    for report in items:
        if not isinstance(report, Mapping) or not isinstance(report.get("models"), Mapping):
            continue
        these = report.get("edges")
        if not isinstance(these, list) or not all(
            isinstance(e, int | float) and not isinstance(e, bool) for e in these
        ):
            these = None
        if edges is None and these is not None:
            edges = these
        for model, figures in report["models"].items():
            if not isinstance(model, str) or not isinstance(figures, Mapping):
                continue
            s = sums.setdefault(model, {"in_flight": 0, "waiting": 0, "ttft": None})
            for k in ("in_flight", "waiting"):
                v = figures.get(k, 0)
                if isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < 1e9:
                    s[k] += v
            ttft = _counts(figures.get("ttft"))
            if ttft is not None and these == edges and edges and len(ttft) == len(edges) + 1:
                s["ttft"] = ttft if s["ttft"] is None else [
                    a + b for a, b in zip(s["ttft"], ttft, strict=True)
                ]  # fmt: skip
    out = {}
    for model, s in sums.items():
        hist = s["ttft"] or []
        out[model] = Load(
            in_flight=s["in_flight"],
            waiting=s["waiting"],
            ttft_p99_ms=quantile_ms(edges or [], hist, 0.99) if hist else None,
            samples=sum(hist),
        )
    return out


def read() -> dict[str, Load]:
    """Every model's load now, summed over the gateway processes (raises Unavailable)."""
    return total(reports())
