"""Live events: what changed, published to the consoles after commit (the bus).

The flow (style.md 2.5): write → commit → event → group → consumer renders the fragment →
htmx swaps it by id. Writers call :func:`changed` with the keys of what they touched;
the keys gather per thread and are published once, after the transaction commits (a
rolled-back write pushes nothing). Payloads are keys only, never HTML.

The bus knows no event by name: each app declares its own and registers them in its
``AppConfig.ready()`` (:func:`register`), as NetBox's apps register their event types.
:data:`EVENTS` is what they registered: each event's topic (what a console asks for,
``/ws/live/<topics>/``, and the keyword a writer marks it with, ``changed(nodes=...)``),
its message type (the consumer's handler: ``cluster.nodes_changed`` is handled by
``cluster_nodes_changed``), its channel-layer group and its one list of keys. This module
publishes from it, the embedded relay checks what arrives against it (``cluster.relay``),
the console's consumer and hub route by it (``llmgw_admin.consumer``, ``llmgw_admin.hub``).
An app may also register a **derivation** (:func:`derive`): keys marked under one name
that, at publish time, mark keys of an event too (the cluster's replica pks are their
models; the guard's judges are among the models marked). A name that is only a
derivation's source is a keyword of ``changed()`` that publishes nothing of its own.

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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
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


@dataclass(frozen=True)
class Derivation:
    """Keys marked under ``source`` that mark keys of ``target`` when published."""

    source: str
    target: str
    keys: Callable[[set[Any]], Iterable[Any]]


# What the apps registered, in the order they did (INSTALLED_APPS' order).
EVENTS: list[Event] = []
BY_TOPIC: dict[str, Event] = {}
BY_TYPE: dict[str, Event] = {}
# What the consumer and the hub look up: a topic's group, an event type's group.
TOPICS: dict[str, str] = {}
GROUP_OF_TYPE: dict[str, str] = {}
DERIVATIONS: list[Derivation] = []
# Where an event goes when no console listens in this process (the embedded relay).
_relay: Callable[[str, dict[str, Any]], None] | None = None


def register(*events: Event) -> None:
    """Add an app's live events (from its ``AppConfig.ready()``).

    Registering the same event again does nothing; another event with a topic, type or
    group already taken raises ValueError naming it.
    """
    for event in events:
        if event in EVENTS:
            continue
        for field in ("topic", "type", "group"):
            value = getattr(event, field)
            if any(getattr(e, field) == value for e in EVENTS):
                raise ValueError(f"live event {event.topic!r}: its {field} {value!r} is taken")
        EVENTS.append(event)
        BY_TOPIC[event.topic] = event
        BY_TYPE[event.type] = event
        TOPICS[event.topic] = event.group
        GROUP_OF_TYPE[event.type] = event.group


def derive(source: str, target: str, keys: Callable[[set[Any]], Iterable[Any]]) -> None:
    """Have the keys marked under ``source`` mark ``keys(them)`` under the event ``target``
    when published (run in the order registered). Registering it again does nothing."""
    derivation = Derivation(source, target, keys)
    if derivation not in DERIVATIONS:
        DERIVATIONS.append(derivation)


def relay_with(send_elsewhere: Callable[[str, dict[str, Any]], None]) -> None:
    """Set where an event goes from a process whose in-memory layer no console listens on."""
    global _relay
    _relay = send_elsewhere


def _names() -> set[str]:
    """Return the keywords ``changed()`` takes: the events' topics and derivations' sources."""
    return set(BY_TOPIC) | {d.source for d in DERIVATIONS}


def keys_of(message: dict[str, Any]) -> list[Any]:
    """Return the keys an event's message carries (its pks or names)."""
    return list(message[BY_TYPE[message["type"]].keys])


class _Pending(threading.local):
    def __init__(self) -> None:
        self.marked: dict[str, set[Any]] = {}
        self.refresh: set[str] = set()


_pending = _Pending()

# The event loop of the process's ASGI server, once a consumer has run on it. The
# in-memory channel layer (the embedded default) is not thread-safe: a send from the
# reconciler's thread must be handed to this loop.
_home_loop: asyncio.AbstractEventLoop | None = None


def set_home_loop(loop: asyncio.AbstractEventLoop) -> None:
    """Remember the loop the consumers run on (called by every consumer's connect)."""
    global _home_loop
    _home_loop = loop


def changed(*, refresh: Iterable[str] = (), **marked: Iterable[Any]) -> None:
    """Mark things changed; they are published once the current transaction commits.

    ``marked`` names keys by topic (:data:`EVENTS`) or by a derivation's source:
    ``nodes=[pk]``, ``models=[name]``, ``replicas=[pk]``...; a name neither registered
    raises TypeError. ``refresh`` names events published even with no keys (an empty
    list: a console refreshes what is not keyed, such as the nodes' power).
    """
    p = _pending
    refresh = set(refresh)
    names = _names()
    for topic in [*marked, *refresh]:
        if topic not in names:
            raise TypeError(f"changed(): no live event {topic!r}; the events: {sorted(names)}")
    for topic, keys in marked.items():
        p.marked.setdefault(topic, set()).update(k for k in keys if k != "")
    p.refresh |= refresh
    if not (p.refresh or any(p.marked.values())):
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
    marked, refresh = p.marked, p.refresh
    p.marked, p.refresh = {}, set()
    for d in DERIVATIONS:
        if marked.get(d.source):
            marked.setdefault(d.target, set()).update(d.keys(marked[d.source]))
    event_id = uuid.uuid4().hex
    for event in EVENTS:
        keys = marked.get(event.topic, set())
        if keys or event.topic in refresh:
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
    return settings.LLMGW_REDIS_TIMEOUT_MS / 1000


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
                # No console has connected to this process. The embedded web process
                # listens for other processes' events (a command in a terminal): hand it
                # this one (``relay_with``). It, or a process with no web process
                # listening, tells nobody.
                if _relay is not None:
                    _relay(group, message)
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
