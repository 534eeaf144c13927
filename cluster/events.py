"""Live events: what changed in the cluster, published to the consoles after commit.

The flow (style.md 2.5): write → commit → event → group → consumer renders the fragment →
htmx swaps it by id. Writers call :func:`changed` with the keys of what they touched;
the keys gather per thread and are published once, after the transaction commits (a
rolled-back write pushes nothing). Payloads are keys only, never HTML.

:data:`EVENTS` is the one catalogue of them: each event's topic (what a console asks for,
``/ws/live/<topics>/``, and the keyword a writer marks it with, ``changed(nodes=...)``),
its message type (the consumer's handler: ``cluster.nodes_changed`` is handled by
``cluster_nodes_changed``), its channel-layer group and its one list of keys. This module
publishes from it, the embedded relay checks what arrives against it (``cluster.relay``),
the console's consumer and hub route by it (``llmgw_admin.consumer``, ``llmgw_admin.hub``).
A new event is a row here and a handler in the consumer.

This module is the only code that calls ``group_send``.

A write never waits on Redis past ``LLMGW_REDIS_TIMEOUT_MS``: a publish that fails or gets
no answer in that time is dropped, and so is every publish of the next ``PAUSE_S``
seconds (said in the log once, then once a minute while it lasts). Nothing is lost that
matters: while Redis is away the consoles are closed to reconnect (``llmgw_admin.hub``)
and each reconnect sends a fresh snapshot; the gateways read their table again anyway.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from redis.exceptions import RedisError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """One kind of live event: ``{"type": type, "id": "<hex>", keys: [item, ...]}`` sent to
    ``group``; ``topic`` is what consoles subscribe by and writers mark with."""

    topic: str
    type: str
    group: str
    keys: str
    item: type
    about: str

    def message(self, event_id: str, keys: Iterable[Any]) -> dict[str, Any]:
        return {"type": self.type, "id": event_id, self.keys: sorted(keys)}


EVENTS = (
    Event("nodes", "cluster.nodes_changed", "cluster.nodes", "pks", int,
          "nodes: their cards, reservations, power (an empty list: the power alone)"),
    Event("models", "cluster.models_changed", "cluster.models", "names", str,
          "models' replicas: states, reasons, progress, rolls, unplaced"),
    Event("judges", "guard.judges_changed", "guard.judges", "names", str,
          "judges' health (the list is sent whole)"),
    Event("evals", "guard.evals_changed", "guard.evals", "pks", int,
          "evaluations: results as they are written, the run's end"),
    # Not keys but figures: each gateway process's last second per model (gateway.traffic).
    Event("traffic", "gateway.traffic_changed", "gateway.traffic", "models", dict,
          "the gateway's traffic: one process's second, per model (figures, not keys)"),
)  # fmt: skip
BY_TOPIC = {e.topic: e for e in EVENTS}
BY_TYPE = {e.type: e for e in EVENTS}
# What the consumer and the hub look up: a topic's group, an event type's group.
TOPICS = {e.topic: e.group for e in EVENTS}
GROUP_OF_TYPE = {e.type: e.group for e in EVENTS}


def keys_of(message: dict[str, Any]) -> list[Any]:
    """Return the keys an event's message carries (its pks or names)."""
    return list(message[BY_TYPE[message["type"]].keys])


class _Pending(threading.local):
    def __init__(self) -> None:
        self.marked: dict[str, set[Any]] = {e.topic: set() for e in EVENTS}
        self.replicas: set[int] = set()
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


def changed(*, replicas: Iterable[int] = (), power: bool = False, **marked: Iterable[Any]) -> None:
    """Mark things changed; they are published once the current transaction commits.

    ``marked`` names keys by topic (:data:`EVENTS`): ``nodes=[pk]``, ``models=[name]``,
    ``judges=[name]``, ``evals=[pk]``; a topic that is not in the catalogue raises
    TypeError. ``power`` alone refreshes the facility domains' power (a budget changed).
    ``replicas`` are replica pks, published as their models (read at publish time, so a
    replica deleted in the same transaction should be named by its model instead).
    """
    p = _pending
    for topic, keys in marked.items():
        if topic not in p.marked:
            raise TypeError(f"changed(): no live event {topic!r}; the events: {sorted(BY_TOPIC)}")
        p.marked[topic].update(k for k in keys if k != "")
    p.replicas.update(replicas)
    p.power = p.power or power
    if not (p.replicas or p.power or any(p.marked.values())):
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
    marked, replicas, power = p.marked, p.replicas, p.power
    p.marked, p.replicas, p.power = {e.topic: set() for e in EVENTS}, set(), False
    if replicas:
        from cluster.models import Replica

        marked["models"] |= set(
            Replica.objects.filter(pk__in=replicas).values_list("model_name", flat=True)
        )
    if marked["models"]:
        # A judge's replicas are part of its health (ready or not).
        from catalog.models import ServedModel
        from catalog.rules import ROLE_GUARD

        marked["judges"] |= set(
            ServedModel.objects.filter(name__in=marked["models"], role=ROLE_GUARD).values_list(
                "name", flat=True
            )
        )
    event_id = uuid.uuid4().hex
    for event in EVENTS:
        keys = marked[event.topic]
        if keys or (power and event.topic == "nodes"):
            send(event.group, event.message(event_id, keys))


# After a publish to Redis failed: how long the next ones are dropped without trying, and
# how often the drops are said.
PAUSE_S = 5.0
SAY_EVERY_S = 60.0


class _Outage:
    """Publishes to the Redis layer since one failed: dropped until ``until``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.until = 0.0
        self.since: float | None = None
        self.said_at = 0.0
        self.dropped = 0


_outage = _Outage()


def _timeout() -> float:
    from django.conf import settings

    return float(getattr(settings, "LLMGW_REDIS_TIMEOUT_MS", 250)) / 1000


async def _bounded_send(layer: Any, group: str, message: dict, timeout: float) -> None:
    await asyncio.wait_for(layer.group_send(group, message), timeout)


def _publish(layer: Any, group: str, message: dict) -> None:
    """Publish to the Redis layer within the timeout, or drop it (logged, never raised)."""
    o = _outage
    now = time.monotonic()
    with o.lock:
        if now < o.until:
            o.dropped += 1
            if now - o.said_at >= SAY_EVERY_S:
                o.said_at = now
                log.warning(
                    "live events are still dropped: Redis has not taken one for %.0f s (%d "
                    "dropped); consoles catch up when they reconnect",
                    now - (o.since or now), o.dropped,
                )  # fmt: skip
            return
    timeout = _timeout()
    try:
        async_to_sync(_bounded_send)(layer, group, message, timeout)
    except (TimeoutError, OSError, RedisError) as exc:  # Redis away, hung or refusing
        _failed(exc, message, group, timeout)
    else:
        with o.lock:
            if o.since is not None:
                log.warning(
                    "live events are published again after %.0f s (%d dropped)",
                    time.monotonic() - o.since, o.dropped,
                )  # fmt: skip
                o.since, o.dropped = None, 0


def _failed(exc: BaseException, message: dict, group: str, timeout: float) -> None:
    o = _outage
    now = time.monotonic()
    said = "no answer" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}"
    with o.lock:
        o.until = now + PAUSE_S
        o.dropped += 1
        if o.since is None:
            o.since = o.said_at = now
            log.warning(
                "could not publish %s to %s (%s within %.0f ms): live events are dropped "
                "for %g s at a time until Redis takes one; consoles catch up when they "
                "reconnect", message.get("type"), group, said, timeout * 1000, PAUSE_S,
            )  # fmt: skip


def send(group: str, message: dict) -> None:
    """Send one message to a group, from any thread; a failure is logged, never raised.

    A console that misses an event resynchronises when its socket reconnects; a write
    must not fail because a push could not be made, nor wait on Redis past its timeout.
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
        _publish(layer, group, message)
    except RuntimeError as exc:
        if _ending(exc):
            # The process is ending (SIGTERM): no thread or task can be started to send it.
            log.debug("dropped %s to %s: the process is ending", message.get("type"), group)
            return
        log.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)
    except Exception:
        log.warning("could not publish %s to %s", message.get("type"), group, exc_info=True)


def _ending(exc: RuntimeError) -> bool:
    """Whether ``exc`` says the interpreter is shutting down (its executors refuse work)."""
    return "after interpreter shutdown" in str(exc) or "after shutdown" in str(exc)
