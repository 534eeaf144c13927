"""Live events: what changed in the cluster, published to the consoles after commit.

The flow (style.md 2.5): write → commit → event → group → consumer renders the fragment →
htmx swaps it by id. Writers call :func:`changed` with the keys of what they touched;
the keys gather per thread and are published once, after the transaction commits (a
rolled-back write pushes nothing). Payloads are keys only, never HTML.

Groups, one per kind of thing a console shows:

- ``cluster.nodes``: nodes (their cards, reservations, power);
- ``cluster.models``: models' replicas (states, reasons, progress, rolls, unplaced);
- ``guard.judges``: judges' health;
- ``guard.evals``: evaluations (results as they are written, the run's end).

This module is the only code that calls ``group_send``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterable
from typing import Literal, TypedDict

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)

NODES_GROUP = "cluster.nodes"
MODELS_GROUP = "cluster.models"
JUDGES_GROUP = "guard.judges"
EVALS_GROUP = "guard.evals"
TOPICS = {
    "nodes": NODES_GROUP,
    "models": MODELS_GROUP,
    "judges": JUDGES_GROUP,
    "evals": EVALS_GROUP,
}
# Which group an event type is published to.
GROUP_OF_TYPE = {
    "cluster.nodes_changed": NODES_GROUP,
    "cluster.models_changed": MODELS_GROUP,
    "guard.judges_changed": JUDGES_GROUP,
    "guard.evals_changed": EVALS_GROUP,
}


class NodesChanged(TypedDict):
    type: Literal["cluster.nodes_changed"]
    id: str
    pks: list[int]


class ModelsChanged(TypedDict):
    type: Literal["cluster.models_changed"]
    id: str
    names: list[str]


class JudgesChanged(TypedDict):
    type: Literal["guard.judges_changed"]
    id: str
    names: list[str]


class EvalsChanged(TypedDict):
    type: Literal["guard.evals_changed"]
    id: str
    pks: list[int]


class _Pending(threading.local):
    def __init__(self) -> None:
        self.nodes: set[int] = set()
        self.models: set[str] = set()
        self.replicas: set[int] = set()
        self.judges: set[str] = set()
        self.evals: set[int] = set()
        self.power = False


_pending = _Pending()

# The event loop of the process's ASGI server, once a consumer has run on it. The
# in-memory channel layer (the embedded default) is not thread-safe: a send from the
# reconciler's thread must be handed to this loop.
_home_loop: asyncio.AbstractEventLoop | None = None


def set_home_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the loop the consumers run on (called by every consumer's connect)."""
    global _home_loop
    _home_loop = loop


def changed(
    *,
    nodes: Iterable[int] = (),
    models: Iterable[str] = (),
    replicas: Iterable[int] = (),
    judges: Iterable[str] = (),
    evals: Iterable[int] = (),
    power: bool = False,
) -> None:
    """Mark things changed; they are published once the current transaction commits.

    ``power`` alone refreshes the facility domains' power (a budget changed).
    ``replicas`` are replica pks, published as their models (read at publish time, so a
    replica deleted in the same transaction should be named by its model instead).
    """
    p = _pending
    p.nodes.update(nodes)
    p.models.update(m for m in models if m)
    p.replicas.update(replicas)
    p.judges.update(judges)
    p.evals.update(evals)
    p.power = p.power or power
    if not (p.nodes or p.models or p.replicas or p.judges or p.evals or p.power):
        return
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        flush()
        return
    # Once per transaction. A rolled-back transaction drops its callbacks (so this looks
    # again each time) and leaves its keys to go with the next publish: a spare refresh.
    if not any(entry[1] is flush for entry in conn.run_on_commit):
        transaction.on_commit(flush, robust=True)


def flush() -> None:
    """Publish what gathered in this thread (called after commit)."""
    p = _pending
    nodes, models, replicas, judges = p.nodes, p.models, p.replicas, p.judges
    evals, power = p.evals, p.power
    p.nodes, p.models, p.replicas, p.judges = set(), set(), set(), set()
    p.evals, p.power = set(), False
    if replicas:
        from cluster.models import Replica

        models |= set(Replica.objects.filter(pk__in=replicas).values_list("model_name", flat=True))
    if models:
        # A judge's replicas are part of its health (ready or not).
        from catalog.models import ServedModel
        from catalog.rules import ROLE_GUARD

        judges |= set(
            ServedModel.objects.filter(name__in=models, role=ROLE_GUARD).values_list(
                "name", flat=True
            )
        )
    sends: list[tuple[str, dict]] = []
    event = uuid.uuid4().hex
    if nodes or power:
        sends.append(
            (NODES_GROUP, {"type": "cluster.nodes_changed", "id": event, "pks": sorted(nodes)})
        )
    if models:
        sends.append(
            (
                MODELS_GROUP,
                {"type": "cluster.models_changed", "id": event, "names": sorted(models)},
            )
        )
    if judges:
        sends.append(
            (JUDGES_GROUP, {"type": "guard.judges_changed", "id": event, "names": sorted(judges)})
        )
    if evals:
        sends.append(
            (EVALS_GROUP, {"type": "guard.evals_changed", "id": event, "pks": sorted(evals)})
        )
    for group, message in sends:
        send(group, message)


def send(group: str, message: dict) -> None:
    """Send one message to a group, from any thread; a failure is logged, never raised.

    A console that misses an event resynchronises when its socket reconnects; a write
    must not fail because a push could not be made.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        loop = _home_loop
        if isinstance(layer, InMemoryChannelLayer):
            if loop is None or loop.is_closed():
                from cluster import relay

                # No console has connected to this process. The embedded web process
                # listens for other processes' events (a command in a terminal): hand it
                # this one. It, or a process with no web process listening, tells nobody.
                if not relay.listening():
                    relay.send(group, message)
                return
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                loop.create_task(layer.group_send(group, message))
            else:
                asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
            return
        async_to_sync(layer.group_send)(group, message)
    except Exception:
        log.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)
