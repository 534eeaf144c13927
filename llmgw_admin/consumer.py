"""The console's live view: cluster and guard state pushed as the fragments the page rendered.

``/ws/live/<topics>/`` with topics among ``nodes``, ``models``, ``judges``, ``evals``,
``peers`` (the federated peers' panel, ``gateway.live``) and ``traffic`` (the gateway's,
pushed once a second, ``gateway.live``)
(comma separated; ``?model=NAME`` narrows ``models`` to one model, for its page;
``?view=catalog`` makes ``models`` the catalog list's ready column, for the models its
other parameters, the list's filters, show (``catalog.views.pages.listed_names``);
``evals`` needs ``?eval=ID``, the evaluation whose page is open). On connect the
consumer sends a snapshot of every region it serves (a reconnect resynchronises); then,
for each event of llmgw_core.events, the changed elements by id. htmx's ws extension swaps
each top-level element by id (out of band). Nothing is written over the socket.

Each process subscribes to the channel layer once per group (llmgw_admin.hub) and hands
events to its consoles; rendering is shared: every console of a process gets the same
HTML for the same event and role, rendered once (bench/live.py), and consoles opening
together with the same regions and role get one snapshot, read and rendered once
(``Hub.share``).

A console is refused cleanly, never with an error: while Redis is away (accepted, then
closed with 1013, so the page retries), when subscribing takes longer than
``JOIN_TIMEOUT_S`` (Redis hung before the hub's ping noticed), and past
``LLMGW_WS_PER_USER`` open consoles of one user in this process (closed with 1008 and
a reason saying so; the page does not retry). The consumer takes no channel of its own
from the layer (``channel_layer_alias``): events reach it through the hub only, so opening
a console asks Redis nothing before the hub does.

Wiring: it reads every app's renderers (``cluster.live``, ``guard.live``), so it lives on
top, in the console's home; no app imports it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from catalog.views.pages import listed_names
from cluster import live as cluster_live
from gateway import live as gateway_live
from gateway.records import traffic as gateway_traffic
from guard import live as guard_live
from llmgw_admin import hub as hub_module
from llmgw_admin.hub import hub
from llmgw_admin.hub import keep as hub_keep
from llmgw_admin.wire import WIRE, Wire, text_frame
from llmgw_core import events
from llmgw_core.roles import OPERATOR, VIEWER, has_role
from updates import live as updates_live
from updates import views as updates_views

log = logging.getLogger(__name__)

# The renders of recent events, shared by this process's consumers: event id, kind and
# role → a future of {key: html or None (gone)}. Kept for a few seconds.
_renders: dict[tuple[str, str, bool], asyncio.Future[dict[Any, str | None]]] = {}
_RENDER_TTL_S = 10.0
# The close code for a console whose events may be missed (RFC 6455 "try again later"):
# htmx's ws extension reconnects on it.
LAYER_AWAY = 1013
# The close code for a console over its user's cap (RFC 6455 "policy violation"): htmx's
# ws extension does not retry it.
TOO_MANY = 1008
# The longest a console waits to be subscribed (Redis hung, before the hub notices).
JOIN_TIMEOUT_S = 2.0
# The longest one send to the browser may wait (a browser that reads nothing): past it
# the console is closed with 1013 and the page reconnects.
SEND_TIMEOUT_S = 5.0
# The longest an event waits for the console's snapshot to be sent first, and the longest
# a console waits for its snapshot to be read and rendered (past it: closed with 1013).
READY_TIMEOUT_S = 8.0
SNAPSHOT_TIMEOUT_S = READY_TIMEOUT_S
# What the hub's heartbeat sends (llmgw_admin.hub.BEAT): a comment htmx swaps nothing
# for; static/llmgw/console.js counts it as heard and says "stale" without it.
BEAT_TEXT = "<!-- llmgw:beat -->"
BEAT_FRAME = text_frame(BEAT_TEXT)
# A console sent a message this recently is not sent the heartbeat (``LiveConsumer.beat``).
BEAT_QUIET_S = hub_module.BEAT_S / 2
# A layer alias with no configuration: channels then gives the consumer no channel.
NO_OWN_CHANNEL = "llmgw-live-hub-only"
# Open consoles per user id in this process (the cap: LLMGW_WS_PER_USER).
_open: dict[int, int] = {}


@dataclass(frozen=True)
class Shown:
    """What a snapshot showed of the dashboard's lists: the blocks by key, and for a page
    with room, every key then listed (a key outside them is new, and appended to the page
    while it has room). Shared by the consoles that share the snapshot: each takes its
    own copy of the blocks shown (``own``), which its pushes then change."""

    nodes: frozenset[int] = frozenset()
    models: frozenset[str] = frozenset()
    nodes_known: frozenset[int] | None = None
    models_known: frozenset[str] | None = None

    def own(self) -> Showing:
        return Showing(set(self.nodes), set(self.models), self.nodes_known, self.models_known)


@dataclass
class Showing:
    """What one console shows of the dashboard's lists now (``Shown``, then its pushes)."""

    nodes: set[int]
    models: set[str]
    nodes_known: frozenset[int] | None
    models_known: frozenset[str] | None


def snapshot(
    topics: list[str],
    can_act: bool,
    model: str | None,
    evaluation: int | None = None,
    pages: cluster_live.Pages | None = None,
) -> tuple[str, Shown]:
    """Return every region of the topics, as the pages render them (each app's renderers),
    and what it shows of the dashboard's lists (the pages ``pages`` names)."""
    parts = []
    nodes: frozenset[int] = frozenset()
    models: frozenset[str] = frozenset()
    nodes_known = models_known = None
    if "nodes" in topics:
        html, node_page = cluster_live.render_nodes(can_act, pages)
        parts.append(html)
        nodes = frozenset(r.pk for r in node_page.rows)
        nodes_known = frozenset(node_page.known) if node_page.known is not None else None
    if "models" in topics:
        if model is not None:
            parts.append(cluster_live.render_model_block(can_act, model))
            models = frozenset({model})
        else:
            html, model_page = cluster_live.render_models(can_act, pages)
            parts.append(html)
            models = frozenset(r.name for r in model_page.rows)
            if model_page.known is not None:
                models_known = frozenset(model_page.known)
    if "judges" in topics:
        parts.append(guard_live.render_judges())
    if "evals" in topics and evaluation is not None:
        parts.append(guard_live.render_eval(evaluation))
    if "traffic" in topics:
        parts.append(gateway_live.render_traffic())
    if "peers" in topics:
        parts.append(gateway_live.render_peers(can_act))
    return "\n".join(parts), Shown(nodes, models, nodes_known, models_known)


def showing(keys: list[Any], shown: set[Any], known: frozenset[Any] | None) -> list[Any]:
    """Return the keys of an event one console's page shows, or adds: those it shows, and
    new ones (not among ``known``) while its page has room (``known`` is None: none)."""
    room = cluster_live.DASHBOARD_PAGE - len(shown)
    out = []
    for key in keys:
        if key in shown:
            out.append(key)
        elif known is not None and key not in known and room > 0:
            out.append(key)
            room -= 1
    return out


def swaps(
    keys: list[Any],
    rendered: dict[Any, str | None],
    shown: set[Any],
    dom_id: Callable[[Any], str],
    list_id: str,
) -> list[str]:
    """Return the elements one console needs for these keys, and note what it now shows.

    An element the page shows is replaced in place; one it lacks is appended to its list;
    one that is gone is deleted. The list's "empty" line stays (console.css hides it
    while the list holds an element): deleting it out of band failed on every page
    that no longer had it (htmx:oobErrorNoTarget).
    """
    parts = []
    for key in keys:
        html = rendered.get(key)
        if html is None:
            if key in shown:
                parts.append(f'<div id="{dom_id(key)}" hx-swap-oob="delete"></div>')
                shown.discard(key)
        elif key in shown:
            parts.append(html)
        else:
            parts.append(f'<div hx-swap-oob="beforeend:#{list_id}">{html}</div>')
            shown.add(key)
    return parts


async def _render(
    kind: str, fn: Callable[..., dict[Any, str | None]], keys: list, can_act: bool
) -> dict[Any, str | None]:
    try:
        return await database_sync_to_async(fn)(keys, can_act)
    except Exception:  # every waiting console hears of it; logged once
        log.exception("rendering %s for the live console failed", kind)
        raise


def _keep_traffic(event: dict[str, Any]) -> None:
    gateway_live.WINDOW.add(events.keys_of(event))


# The process keeps the gateways' seconds once it hears them, consoles open or not: the
# hub stays subscribed, so a Traffic page opened later renders the current streams.
hub_keep(gateway_traffic.TYPE, _keep_traffic)


class LiveConsumer(AsyncWebsocketConsumer):
    """One open console: the regions it shows, kept current."""

    topics: list[str]
    can_act: bool
    model: str | None
    evaluation: int | None
    # The catalog list's ready cells (?view=catalog): the names its filters show, or None.
    listed: set[str] | None = None
    # The Updates page (?view=updates): its filters, to ask for its table again; or None.
    updates_view: dict[str, str] | None = None
    # The dashboard's pages this console shows (?nodes_page=, ?models_page=) and what its
    # snapshot showed of them.
    pages: cluster_live.Pages
    shown: Showing
    # Events come through the hub (llmgw_admin.hub), never to a channel of this console's.
    channel_layer_alias = NO_OWN_CHANNEL
    counted: int | None = None  # the user id this console is counted against
    # Set once this console closes (by itself or by the browser): an event that was on
    # its way is dropped, not sent after the close (uvicorn refuses that with a
    # RuntimeError, which the hub logged with its traceback each time Redis went away).
    closing: bool = False
    # Its connection, written to directly (llmgw_admin.wire), under the server
    # llmgw_admin.server runs; None elsewhere (sent through ASGI).
    wire: Wire | None = None
    # When it was last sent a message (time.monotonic()), written directly: a heartbeat
    # soon after says nothing the page does not know (``beat``).
    said: float = 0.0

    async def close(self, code: int | bool | None = None, reason: str | None = None) -> None:
        self.closing = True
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await super().close(code=code, reason=reason)

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None,
                   close: bool = False) -> None:  # fmt: skip
        """Send a text straight to the connection (``Wire``: the frame built once for every
        console sending the same text, written without waiting; a console that leaves
        too much unread is cut and forgotten). Through ASGI otherwise, within
        SEND_TIMEOUT_S; past it the console is closed (1013: it reconnects) and
        TimeoutError raised (the hub drops it)."""
        if self.closing:
            return
        if self.wire is not None and text_data is not None and not close:
            if self.wire.write(text_frame(text_data)):
                self.said = time.monotonic()
            else:
                self._forget()  # closed, or cut: its disconnect comes too
            return
        try:
            # asyncio.timeout, not wait_for (a task of each send on Python 3.11): this runs
            # once per console for every event and heartbeat.
            async with asyncio.timeout(SEND_TIMEOUT_S):
                await super().send(text_data=text_data, bytes_data=bytes_data, close=close)
        except TimeoutError:
            log.warning("a live console took over %.0f s to take a message: closed",
                        SEND_TIMEOUT_S)  # fmt: skip
            await self._close_quietly(LAYER_AWAY)
            raise

    async def _close_quietly(self, code: int, reason: str | None = None) -> None:
        """Close within SEND_TIMEOUT_S, saying nothing if the browser is gone already."""
        try:
            await self.close(code=code, reason=reason)
        except (TimeoutError, RuntimeError, OSError):
            log.info("a live console left before it could be closed")

    async def _accept(self) -> bool:
        """Accept the socket, or say False when the browser left while ``connect`` read what
        it needed (a slow database, Redis away): uvicorn then refuses the accept with a
        RuntimeError, and its disconnect is already on its way to this consumer."""
        try:
            await self.accept()
        except (RuntimeError, OSError):
            log.info("a live console left before it was accepted")
            return False
        return True

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close()
            return
        if not await database_sync_to_async(has_role)(user, VIEWER):
            await self.close()
            return
        cap = int(settings.LLMGW_WS_PER_USER)
        if _open.get(user.pk, 0) >= cap:
            log.warning(
                "refused a live console of %s: %d are open in this process (LLMGW_WS_PER_USER)",
                user.get_username(), cap,
            )  # fmt: skip
            if not await self._accept():
                return
            await self.close(
                code=TOO_MANY,
                reason=f"too many live consoles open: at most {cap} a user; close some tabs",
            )  # fmt: skip
            return
        _open[user.pk] = _open.get(user.pk, 0) + 1
        self.counted = user.pk
        raw = self.scope["url_route"]["kwargs"].get("topics", "")
        topics = [t for t in raw.split(",") if t]
        if not topics or any(t not in events.TOPICS for t in topics):
            await self.close()
            return
        query = parse_qs(self.scope.get("query_string", b"").decode())
        self.model = query["model"][0] if query.get("model") else None
        self.pages = cluster_live.Pages.of(query)
        if query.get("view") == ["updates"]:
            self.updates_view = {k: query[k][-1][:200] for k in ("q", "state") if query.get(k)}
        if query.get("view") == ["catalog"]:
            filters = {k: v[-1] for k, v in query.items() if k != "view"}
            self.listed = await database_sync_to_async(listed_names)(filters)
        wanted = query.get("eval", [""])[0]
        # An id a bigint column holds; any other is no evaluation's (the socket is closed).
        self.evaluation = int(wanted) if wanted.isdigit() and len(wanted) <= 18 else None
        if "evals" in topics and self.evaluation is None:
            await self.close()  # the evaluations' topic is one evaluation's page
            return
        self.topics = topics
        self.wire = self.scope.get(WIRE)
        self.can_act = await database_sync_to_async(has_role)(user, OPERATOR)
        events.set_home_loop(asyncio.get_running_loop())
        if not await self._accept():
            return
        # Events that arrive while the snapshot is read wait, and are applied after it.
        self.ready = asyncio.Event()
        # While the channel layer (Redis) is away nothing could be pushed: the page says
        # it is not live and tries again (1013: try again later).
        if hub().away:
            await self.close(code=LAYER_AWAY)
            return
        try:
            await asyncio.wait_for(
                hub().join(self, [events.TOPICS[t] for t in topics]), JOIN_TIMEOUT_S
            )
        except Exception as exc:
            said = "no answer" if isinstance(exc, TimeoutError) else exc
            log.warning("a live console cannot subscribe (%s); it will retry", said)
            hub().leave(self)
            await self._close_quietly(LAYER_AWAY)
            return
        # Whatever happens to the snapshot, this console is ready or out of the hub: one
        # that stayed in it unready held back events (each member's are its own now, and
        # bounded, but a console the browser left must not linger).
        try:
            html, first = await self._first_state()
        except BaseException as exc:
            self._forget()
            self.ready.set()
            if isinstance(exc, TimeoutError):
                log.warning("a live console's snapshot was not ready within %.0f s: closed",
                            SNAPSHOT_TIMEOUT_S)  # fmt: skip
            elif isinstance(exc, Exception):
                log.exception("the live console's snapshot failed; the page retries")
            else:
                raise
            await self._close_quietly(LAYER_AWAY)
            return
        try:
            self.shown = first.own()
            await self.send(text_data=html)
        except BaseException as exc:
            # The browser left as the snapshot was read or sent (uvicorn's
            # ClientDisconnected, an OSError: its disconnect may never reach
            # ``disconnect``), or the snapshot failed: out of the hub, uncounted.
            self._forget()
            if isinstance(exc, OSError | RuntimeError | TimeoutError):
                log.info("a live console left before its snapshot was sent (%r)", exc)
                return
            if isinstance(exc, Exception):
                log.exception("the live console's snapshot failed; the page retries")
                await self._close_quietly(LAYER_AWAY)
                return
            raise
        finally:
            self.ready.set()
        if "traffic" in topics:
            gateway_live.WINDOW.listen()  # subscribed: the gateways' seconds come from now
            self.traffic_task = asyncio.get_running_loop().create_task(self._push_traffic())

    async def _first_state(self) -> tuple[str, Shown]:
        """This console's snapshot, read and rendered once for every console of the
        process that shows the same regions (the same pages of the dashboard's lists) to
        the same role and joins before an event of its groups arrives (``Hub.share``)."""
        listed = frozenset(self.listed) if self.listed is not None else None
        view = tuple(sorted(self.updates_view.items())) if self.updates_view is not None else None
        key = ("snapshot", tuple(self.topics), self.can_act, self.model, self.evaluation, listed,
               view, self.pages.nodes, self.pages.models)  # fmt: skip
        groups = [events.TOPICS[t] for t in self.topics]
        return await hub().share(
            key, groups, database_sync_to_async(self._snapshot), SNAPSHOT_TIMEOUT_S
        )

    def _snapshot(self) -> tuple[str, Shown]:
        """What a console shows first; made for every console that shares its key
        (``_first_state``), so it reads only what that key holds."""
        if self.updates_view is not None:
            return "", Shown()  # the page's own render is its snapshot
        if self.listed is not None:
            cells = cluster_live.ready_changed(sorted(self.listed), self.can_act)
            return "\n".join(h for h in cells.values() if h), Shown()
        return snapshot(self.topics, self.can_act, self.model, self.evaluation, self.pages)

    async def disconnect(self, code: int) -> None:
        self._forget()

    def _forget(self) -> None:
        """This console is gone: out of the hub, its traffic pushes stopped, uncounted
        (called again does nothing)."""
        self.closing = True
        if self.counted is not None:
            left = _open.get(self.counted, 1) - 1
            if left > 0:
                _open[self.counted] = left
            else:
                _open.pop(self.counted, None)
            self.counted = None
        hub().leave(self)
        task = getattr(self, "traffic_task", None)
        if task is not None:
            task.cancel()

    async def _push_traffic(self) -> None:
        """The traffic panel, once a second when it changed (rendered once a second for
        every console of the process: gateway.live)."""
        last = None
        while True:
            await asyncio.sleep(1.0 - (time.time() % 1.0) + 0.1)
            try:
                html = await database_sync_to_async(gateway_live.render_traffic)()
            except Exception:
                log.exception("rendering the live traffic failed")
                continue
            if html != last:
                last = html
                try:
                    await self.send(text_data=html)
                except (TimeoutError, OSError, RuntimeError):
                    self._forget()  # closed by the send, or the browser left
                    return

    async def behind(self) -> None:
        """This console fell behind the hub's events (llmgw_admin.hub): it may miss some, so
        it is closed with 1013; the page reconnects and its snapshot shows what it missed."""
        self._forget()
        await self._close_quietly(LAYER_AWAY, "fell behind the live events; reconnecting")

    async def layer_lost(self) -> None:
        """The channel layer went away: events may be missed, so this console is not live.

        Closed with 1013 (try again later): the page's badge says it is reconnecting, and
        the reconnect, once the layer is back, subscribes again and sends a fresh snapshot.
        """
        await self.close(code=LAYER_AWAY)

    async def handle_event(self, event: dict[str, Any]) -> None:
        """Take an event from the process's hub (llmgw_admin.hub): handled by the method
        its type names (``cluster.nodes_changed``: ``cluster_nodes_changed``), one for each
        event of ``llmgw_core.events.EVENTS``."""
        try:
            if not self.ready.is_set():
                async with asyncio.timeout(READY_TIMEOUT_S):
                    await self.ready.wait()
        except TimeoutError:
            log.warning("a live console was not ready within %.0f s: closed", READY_TIMEOUT_S)
            self._forget()
            await self._close_quietly(LAYER_AWAY)
            return
        if self.closing:
            return
        handler = getattr(self, event["type"].replace(".", "_"), None)
        if handler is not None:
            await handler(event)

    async def _rendered(
        self, event: dict[str, Any], kind: str, fn: Callable[..., dict[Any, str | None]], keys: list
    ) -> dict[Any, str | None]:
        key = (event["id"] + ":" + ",".join(map(str, keys)), kind, self.can_act)
        fut = _renders.get(key)
        if fut is None:
            # Rendered in a task of its own: a console that stops waiting (the hub's bound,
            # a close) does not stop the render the others wait for.
            loop = asyncio.get_running_loop()
            fut = loop.create_task(_render(kind, fn, keys, self.can_act))
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # logged there
            _renders[key] = fut
            loop.call_later(_RENDER_TTL_S, _renders.pop, key, None)
        return await asyncio.shield(fut)

    def beat(self) -> bool:
        """The hub's heartbeat (llmgw_admin.hub.BEAT), said at once on the connection
        (``Wire``). Nothing is said to a console not yet sent its snapshot (it comes
        first), nor to one sent a message within the last ``BEAT_QUIET_S``: its page has
        just heard from the server, and hears within 1.5 beats again (under the 5 s
        after which it says "stale"). False through ASGI: taken in turn (``live_beat``)."""
        if self.wire is None:
            return False
        if self.closing or not self.ready.is_set():
            return True
        now = time.monotonic()
        if now - self.said < BEAT_QUIET_S:
            return True
        if self.wire.write(BEAT_FRAME):
            self.said = now
        else:
            self._forget()
        return True

    async def live_beat(self, event: dict[str, Any]) -> None:
        """The hub's heartbeat taken in turn (through ASGI): the page hears it is kept
        current."""
        await self.send(text_data=BEAT_TEXT)

    async def cluster_nodes_changed(self, event: dict[str, Any]) -> None:
        shown = self.shown
        pks = showing(events.keys_of(event), shown.nodes, shown.nodes_known)
        rendered = await self._rendered(event, "nodes", cluster_live.nodes_changed, pks)
        parts = [rendered["power"] or "", rendered["summary"] or ""]
        parts += swaps(pks, rendered, shown.nodes, "cluster-node-{}".format, "cluster-nodes")
        await self.send(text_data="\n".join(parts))

    async def cluster_models_changed(self, event: dict[str, Any]) -> None:
        names = events.keys_of(event)
        if self.updates_view is not None:
            # The Updates page: asked to fetch its table again, filters and all (its own
            # session renders it; updates.views).
            await self.send(text_data=updates_views.region_poke(self.updates_view))
            return
        if self.listed is not None:
            shown = [n for n in names if n in self.listed]
            if shown:
                cells = await self._rendered(event, "ready", cluster_live.ready_changed, names)
                # Each model's "update available" badge beside its name (updates.live).
                badges = await self._rendered(
                    event, "update-badges", updates_live.badges_changed, names
                )
                await self.send(
                    text_data="\n".join((cells[n] or "") + (badges[n] or "") for n in shown)
                )
            return
        if self.model is not None:
            # A model's own page: its block only, empty when it has no replicas left.
            if self.model not in names:
                return
            rendered = await self._rendered(
                event, "models", cluster_live.models_changed, [self.model]
            )
            html = rendered.get(self.model) or await database_sync_to_async(
                cluster_live.render_model
            )(None, self.can_act, self.model)
            # Its weights and updates panel too: a fetch's progress, a check's result.
            panel = await self._rendered(
                event, "update-panels", updates_live.panel_pokes, [self.model]
            )
            await self.send(text_data=html + (panel.get(self.model) or ""))
            return
        view = self.shown
        names = showing(names, view.models, view.models_known)
        rendered = await self._rendered(event, "models", cluster_live.models_changed, names)
        parts = [rendered[("unplaced",)] or "", rendered[("summary",)] or ""]
        parts += swaps(names, rendered, view.models, cluster_live.model_dom_id, "cluster-models")
        await self.send(text_data="\n".join(parts))

    async def guard_judges_changed(self, event: dict[str, Any]) -> None:
        names = events.keys_of(event)
        rendered = await self._rendered(event, "judges", guard_live.judges_changed, names)
        await self.send(text_data=rendered["all"] or "")

    async def gateway_peers_changed(self, event: dict[str, Any]) -> None:
        names = events.keys_of(event)
        rendered = await self._rendered(event, "peers", gateway_live.peers_changed, names)
        await self.send(text_data=rendered["all"] or "")

    async def gateway_traffic_changed(self, event: dict[str, Any]) -> None:
        """A gateway process's last second: kept in the process's window by the hub as it
        arrives (``_keep_traffic``); pushed by ``_push_traffic``."""

    async def guard_evals_changed(self, event: dict[str, Any]) -> None:
        if self.evaluation not in events.keys_of(event):
            return
        html = await database_sync_to_async(guard_live.render_eval)(self.evaluation)
        await self.send(text_data=html)
