"""An agent's reports of its replicas' states (docs/agent-protocol.md): checked whole,
applied together, the engine log they carry bounded and its secrets masked.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from cluster.agentinput import INT32, INT64, AgentError, whole_number
from cluster.choices import ReplicaState
from cluster.models import (
    Assignment,
    Node,
    Replica,
)
from cluster.services import refresh_replica_state

STATES = {s.value for s in ReplicaState}


def read_report(i: int, rep: Any) -> tuple[dict[str, Any], str, datetime | None]:
    """Check ``reports[i]`` of an agent's report; return it clean, its state and time.

    Raises AgentError naming the field. Missing or null port, pid and restarts leave what
    is recorded; a missing time is the time it arrives.
    """
    where = f"reports[{i}]"
    if not isinstance(rep, dict):
        raise AgentError(f"{where} must be a JSON object (docs/agent-protocol.md)")
    replica = rep.get("replica")
    if isinstance(replica, bool) or not isinstance(replica, int) or not 0 < replica <= INT64:
        raise AgentError(f"{where} needs an integer replica")
    state = rep.get("state")
    if not isinstance(state, str) or state not in STATES:
        raise AgentError(f"{where}.state {state!r:.40} is not one of {', '.join(sorted(STATES))}")
    reason = rep.get("reason")
    if reason is not None and not isinstance(reason, str):
        raise AgentError(f"{where}.reason must be text")
    progress = rep.get("progress")
    if progress is not None and (
        isinstance(progress, bool)
        or not isinstance(progress, int | float)
        or not 0 <= progress <= 1
    ):
        raise AgentError(f"{where}.progress must be a number from 0 to 1, or null")
    at = rep.get("at")
    when = None
    if at is not None:
        try:
            when = parse_datetime(at) if isinstance(at, str) else None
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise AgentError(
                f"{where}.at must be an ISO 8601 time with its offset, like {_EXAMPLE_AT}"
            )
    log_lines = rep.get("log")
    if log_lines is not None and (
        not isinstance(log_lines, list) or not all(isinstance(x, str) for x in log_lines)
    ):
        raise AgentError(f"{where}.log must be a list of text lines, or missing")
    clean = {
        "replica": replica,
        "log": None if log_lines is None else engine_log(log_lines),
        "reason": (reason or "")[:2000],
        "progress": None if progress is None else float(progress),
        "port": whole_number(rep.get("port"), f"{where}.port", 65535, None),
        "pid": whole_number(rep.get("pid"), f"{where}.pid", INT32, None),
        "restarts": whole_number(rep.get("restarts"), f"{where}.restarts", INT32, None),
    }
    return clean, state, when


_EXAMPLE_AT = "2026-11-30T10:00:00Z"

# What is kept of an engine's log a report carries: the last lines, each cut to a length.
LOG_LINES = 40
LOG_LINE_CHARS = 300
# Any llmgw secret, masked again here (an older or altered agent may not mask it).
_SECRET = re.compile(r"llmgw_(?:engine|node|join|[a-z]+)_[A-Za-z0-9_\-]{8,}")


def engine_log(lines: list[str]) -> list[str]:
    """Return the part of a reported engine log that is kept: bounded, secrets masked."""
    return [_SECRET.sub("[secret]", line[:LOG_LINE_CHARS]) for line in lines[-LOG_LINES:]]


@transaction.atomic
def report(node: Node, reports: Any) -> int:
    """Apply an agent's state reports; refuse the whole batch if one is not its to give."""
    if not isinstance(reports, list):
        raise AgentError("reports must be a list")
    parsed = [read_report(i, rep) for i, rep in enumerate(reports)]
    ids = {rep["replica"] for rep, _, _ in parsed}
    assignments = {
        a.replica_id: a
        for a in Assignment.objects.select_for_update().filter(node=node, replica_id__in=ids)
    }
    foreign = ids - set(assignments)
    known_elsewhere = set(Replica.objects.filter(pk__in=foreign).values_list("pk", flat=True))
    if known_elsewhere:
        raise AgentError(
            f"replica {sorted(known_elsewhere)[0]} is not on node {node.name}: nothing applied",
            403,
        )
    touched: set[int] = set()
    for rep, state, at in parsed:
        a = assignments.get(rep["replica"])
        if a is None:
            # A replica deleted meanwhile: its engine is being stopped; nothing to record.
            continue
        port = rep["port"] if rep["port"] is not None else a.port
        pid = rep["pid"] if rep["pid"] is not None else a.pid
        r = a.replica
        same = (
            (a.state, a.reason, a.port, a.pid, r.progress)
            == (
                state,
                rep["reason"],
                port,
                pid,
                rep["progress"],
            )
            and rep["restarts"] in (None, r.restarts)
            and r.state == state
        )
        a.state = state
        a.reason = rep["reason"]
        a.port = port
        a.pid = pid
        a.reported = at or timezone.now()
        if rep["log"] is not None:
            a.log = rep["log"]
        if same:
            # Only the engine's log moved (a running engine's lines, every few seconds):
            # written without a save's signals, so no live event to every open dashboard.
            Assignment.objects.filter(pk=a.pk).update(reported=a.reported, log=a.log)
            continue
        a.save()
        r.progress = rep["progress"]
        if rep["restarts"] is not None:
            r.restarts = rep["restarts"]
        touched.add(r.pk)
        r.save(update_fields=["progress", "restarts"])
    for rid in touched:
        refresh_replica_state(Replica.objects.get(pk=rid))
    return len(parsed)
