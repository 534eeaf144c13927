"""The nodes' desired lists, changed: replicas taken off them (stopped, draining first, or
released to be placed again) and the nodes told to read their lists again.

Below every operation that stops a replica or moves one: the reconciler's ticks, the
operators' services (``cluster.services``, which hands these on), a drain
(``cluster.replace``) and an agent's join (``cluster.agentjoin``). It imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import F
from django.utils import timezone

from cluster.choices import ReplicaState
from cluster.models import Assignment, Node, Replica
from llmgw_core import events


def bump_desired(node_ids: Iterable[int]) -> None:
    """Tell these nodes' agents their desired list changed (read again at once)."""
    ids = list(set(node_ids))
    if ids:
        Node.objects.filter(pk__in=ids).update(desired_version=F("desired_version") + 1)


def stop_replicas(
    ids: Iterable[int], reason: str, drain_s: float = 0.0, now: datetime | None = None
) -> None:
    """Mark replicas to be stopped; unplaced ones are simply removed.

    With ``drain_s``, a ready replica drains first: it leaves every gateway's table now
    (``desired`` false: the gateways read again on the change) while its engine runs on
    (its node's desired list keeps it until ``drain_until``), so the requests in flight
    finish; then ``cluster.services.end_drains`` takes it off the list and its agent
    stops the engine.
    """
    ids = list(ids)
    Replica.objects.filter(pk__in=ids, assignments__isnull=True).delete()
    nodes = set(Assignment.objects.filter(replica_id__in=ids).values_list("node_id", flat=True))
    until = (now or timezone.now()) + timedelta(seconds=drain_s) if drain_s > 0 else None
    for r in Replica.objects.filter(pk__in=ids):
        if until is not None and r.desired and r.state == ReplicaState.READY:
            r.drain_until = until
            reason = f"draining, then stopping: {reason}"
        r.desired = False
        r.set_state(ReplicaState.STOPPING, reason)
        r.save()
    bump_desired(nodes)


def release_assignments(assignments: list[Assignment], reason: str) -> None:
    """Take replicas off their nodes: desired ones wait to be placed again.

    Each is placed again at a higher generation: its engine may still run where it was
    (an agent that has not read its list since, a lost node's), and were it placed again
    on that node under the generation that engine runs, the agent would keep it as it is
    and say nothing, leaving the replica pending for good. At a new generation the agent
    stops that engine and starts it again, reporting each step.
    """
    release({a.replica_id: reason for a in assignments})


def release(reasons: dict[int, str], evicted_by: dict[int, str] | None = None) -> None:
    """Take these replicas off their nodes, each with its reason (``release_assignments``),
    in a fixed number of queries however many: every assignment of theirs deleted, those
    no longer desired deleted, the rest written back pending in one update. With
    ``evicted_by``, each evicted replica records the request it made way for."""
    if not reasons:
        return
    ids = sorted(reasons)
    Assignment.objects.filter(replica_id__in=ids).delete()
    replicas = list(Replica.objects.filter(pk__in=ids).order_by("pk"))
    gone = [r.pk for r in replicas if not r.desired]
    if gone:
        Replica.objects.filter(pk__in=gone).delete()
    kept = [r for r in replicas if r.desired]
    for r in kept:
        r.set_state(ReplicaState.PENDING, reasons[r.pk])
        r.unplaced = False  # to be placed again
        r.port = None
        r.endpoint = ""
        r.generation += 1
        if evicted_by is not None and r.pk in evicted_by:
            r.evicted_by = evicted_by[r.pk]
    fields = ["state", "reason", "state_changed", "ready_since", "unplaced", "port"]
    fields += ["endpoint", "generation"] + (["evicted_by"] if evicted_by else [])
    if kept:
        update_rows(kept, fields)
        # What saving each would have told the consoles (``cluster.signals``).
        events.changed(models=sorted({r.model_name for r in kept}))


# PostgreSQL takes at most 65,535 parameters in one statement.
MAX_PARAMS = 65_535


def update_rows(rows: list[Any], fields: list[str]) -> None:
    """Write these fields of these rows (instances of one model) in one statement.

    On PostgreSQL, ``UPDATE ... FROM (VALUES ...)`` joined on the primary key, whose
    cost grows with the rows: Django's ``bulk_update`` writes each field as a CASE with
    a branch per row, which the server walks for every row (thousands of replicas
    placed in a tick took most of a minute). Elsewhere (the embedded SQLite),
    ``bulk_update``. No ``post_save`` is sent: the caller tells the consoles.
    """
    if not rows:
        return
    model = type(rows[0])
    if connection.vendor != "postgresql":
        model.objects.bulk_update(rows, fields)
        return
    meta = model._meta
    pk = meta.pk
    columns = [meta.get_field(f) for f in fields]
    qn = connection.ops.quote_name
    names = ", ".join(qn(c.column) for c in [pk, *columns])
    row = "(" + ", ".join(f"%s::{c.db_type(connection)}" for c in [pk, *columns]) + ")"
    head = f"UPDATE {qn(meta.db_table)} AS t SET " + ", ".join(
        f"{qn(c.column)} = v.{qn(c.column)}" for c in columns
    )
    per = MAX_PARAMS // (len(columns) + 1)
    for start in range(0, len(rows), per):
        part = rows[start : start + per]
        params: list[Any] = []
        for r in part:
            params.append(r.pk)
            params.extend(c.get_db_prep_save(getattr(r, c.attname), connection) for c in columns)
        sql = (
            f"{head} FROM (VALUES {', '.join([row] * len(part))}) AS v({names}) "
            f"WHERE t.{qn(pk.column)} = v.{qn(pk.column)}"
        )
        with connection.cursor() as cur:
            cur.execute(sql, params)
