"""One channel-layer subscription per process, shared by that process's live consoles.

With a subscription per console, the Redis layer delivers (and the process decodes) every
event once per open console: about 1 ms each on these machines (facts.md), so a change
took over 100 ms to reach the hundredth console. The hub subscribes the process once per
group and hands each event to the consoles of that group in the process, which render it
once between them (llmgw_admin.consumer) and send it.

No console holds another's events: each member has its own bounded queue and its own
task taking events from it, in the order they arrived. The receive loop only puts an
event in each member's queue, never waits on a member. A member whose queue is full
(``QUEUE_SIZE`` events behind), or that takes longer than ``TAKE_TIMEOUT_S`` over one
event (a browser that reads nothing, a console that never became ready), is dropped and
told to reconnect (``Member.behind``: closed with 1013, so the page reconnects and its
fresh snapshot shows what it missed).

The first state of members that join together (a console's snapshot) is made once for
all of them while no event of its groups arrives (``Hub.share``): the hub counts the
events it hears per group, and a state made before one of them is not handed out again.

Every ``BEAT_S`` the hub sends itself a heartbeat through the layer, and hands it to
every member (``BEAT``): it takes the path a change takes through the layer and the
receive loop, so a page that has heard nothing for a few seconds knows it is not being
kept current and says "stale" (static/llmgw/console.js). Each member says it to its page
at once (``Member.beat``: a few bytes written, no task's turn, a thousand consoles' beats
in one pass), or, one that cannot, takes it in turn as an event.

While the layer's Redis is away, events are dropped where they are published, and nothing
says so to the consoles: the hub pings Redis every second, and when it does not answer
tells each console to reconnect (closed with 1013, "try again later"), so the page says it
is not live; consoles are let in again only once Redis answers, and each reconnect brings
a fresh snapshot, showing what changed meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from channels.layers import get_channel_layer
from django.conf import settings
from redis.asyncio import Redis
from redis.exceptions import RedisError

from llmgw_core import events

log = logging.getLogger(__name__)

# How often the hub asks Redis whether it is there, and how long it waits for the answer.
PING_S = 1.0
PING_TIMEOUT_S = 2.0
# The hub's heartbeat: its type, and how often every member hears it (the page says
# "stale" after a few seconds without a message: static/llmgw/console.js).
BEAT = "live.beat"
BEAT_S = 2.0
# Events one member may have waiting; past it the member is dropped (told to reconnect).
QUEUE_SIZE = 100
# The longest one member may take over one event (its render and its send); past it the
# member is dropped (looked at every BEAT_S, or a quarter of this if shorter). And how
# long telling a member to go, or subscribing, may take.
TAKE_TIMEOUT_S = 10.0
TELL_TIMEOUT_S = 2.0
# How long a state made for members that join (``Hub.share``) is handed to others that
# join after it, while no event of its groups has arrived since it began.
SHARE_S = 2.0

T = TypeVar("T")


# What the process keeps of an event whatever its consoles (``keep``): the gateways'
# traffic, so a Traffic page opened later shows the current streams at once.
KEEPERS: dict[str, Callable[[dict[str, Any]], None]] = {}


def keep(event_type: str, keeper: Callable[[dict[str, Any]], None]) -> None:
    """Have the hub hand every event of the type to ``keeper`` once, as it arrives."""
    KEEPERS[event_type] = keeper


class Member(Protocol):
    async def handle_event(self, event: dict[str, Any]) -> None: ...

    def beat(self) -> bool:
        """Take the heartbeat at once, without waiting; False: it is put in the member's
        queue, and taken in turn as an event."""
        ...

    async def layer_lost(self) -> None: ...

    async def behind(self) -> None: ...


class Mailbox:
    """One member's waiting events, taken in order by a task of its own."""

    def __init__(self, hub: Hub, member: Member) -> None:
        self.hub = hub
        self.member = member
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        # When the member began taking the event it is on (loop time), or None.
        self.since: float | None = None
        self.task = asyncio.get_running_loop().create_task(self._take())

    def offer(self, event: dict[str, Any]) -> bool:
        """Put the event in the queue; False when the member is too far behind."""
        try:
            self.queue.put_nowait(event)
        except asyncio.QueueFull:
            return False
        return True

    async def _take(self) -> None:
        # No timer for each wait: this runs once per console for every event, and a timer each
        # (asyncio.timeout) was a tenth of a fan-out's CPU. The wait for an event lasts
        # while the member is in the hub (``Hub.leave`` cancels this task), and one event's
        # take is bounded by the hub's watch over ``since`` (``Hub._overdue``).
        loop = asyncio.get_running_loop()
        while self.hub.boxes.get(self.member) is self:
            event = await self.queue.get()
            self.since = loop.time()
            try:
                await self.member.handle_event(event)
            except Exception:
                log.warning("a live console failed to take an event", exc_info=True)
            finally:
                self.since = None


@dataclass
class Shared:
    """A state being made, or made, for the members that join (``Hub.share``)."""

    heard: tuple[int, ...]
    at: float
    task: asyncio.Task[Any]


class Hub:
    """The consoles of one event loop (one server process), by group."""

    def __init__(self) -> None:
        self.members: dict[str, set[Member]] = defaultdict(set)
        self.boxes: dict[Member, Mailbox] = {}
        self.subscribed: set[str] = set()
        self.channel: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()
        # Whether the layer's Redis failed to answer its last ping (or a receive failed).
        self.away = False
        self.watch: asyncio.Task[None] | None = None
        self.beat: asyncio.Task[None] | None = None
        # Members being told to go (kept so their tasks are not collected midway).
        self.telling: set[asyncio.Task[None]] = set()
        # Events heard per group, and how many times the hub subscribed afresh (a new
        # receive loop, Redis back): what a shared state (``share``) was made at.
        self.heard: dict[str, int] = defaultdict(int)
        self.epoch = 0
        self.shared: dict[Hashable, Shared] = {}

    async def join(self, member: Member, groups: list[str]) -> None:
        """Add a console to the groups; raises when the layer cannot subscribe (Redis away)."""
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        if settings.REDIS_URL and (self.watch is None or self.watch.done()):
            self.watch = loop.create_task(self._watch(layer))
        async with self.lock:
            if self.task is None or self.task.done():
                self.channel = await layer.new_channel("live-hub.")
                self.subscribed = set()
                self._forget_shared()
                self.task = loop.create_task(self._run(layer))
            if self.beat is None or self.beat.done():
                self.beat = loop.create_task(self._beat(layer))
            for group in groups:
                if group not in self.subscribed:
                    await layer.group_add(group, self.channel)
                    self.subscribed.add(group)
            if member not in self.boxes:
                self.boxes[member] = Mailbox(self, member)
            for group in groups:
                self.members[group].add(member)

    def leave(self, member: Member) -> None:
        for group in self.members.values():
            group.discard(member)
        box = self.boxes.pop(member, None)
        if box is not None and box.task is not asyncio.current_task():
            box.task.cancel()

    def drop(self, member: Member) -> None:
        """Take a member out that fell behind, and tell it to reconnect (bounded)."""
        self.leave(member)
        task = asyncio.get_running_loop().create_task(self._tell(member.behind))
        self.telling.add(task)
        task.add_done_callback(self.telling.discard)

    @staticmethod
    async def _tell(how: Any) -> None:
        try:
            await asyncio.wait_for(how(), TELL_TIMEOUT_S)
        except Exception:
            log.info("a live console could not be told to reconnect", exc_info=True)

    def deliver(self, event: dict[str, Any]) -> None:
        """Put an event in the queue of each member it is for; never waits on one."""
        keeper = KEEPERS.get(event.get("type", ""))
        if keeper is not None:
            try:
                keeper(event)
            except Exception:
                log.warning("keeping a live event failed", exc_info=True)
        if event.get("type") == BEAT:
            # Said at once by each member that can (``Member.beat``), without a task's turn.
            members = [m for m in list(self.boxes) if not self._beat_now(m)]
        else:
            group = events.GROUP_OF_TYPE.get(event.get("type", ""))
            members = list(self.members.get(group, ())) if group else []
            if group:
                self.heard[group] += 1
        for member in members:
            box = self.boxes.get(member)
            if box is not None and not box.offer(event):
                log.warning(
                    "a live console is %d events behind: dropped, it reconnects", QUEUE_SIZE
                )
                self.drop(member)

    @staticmethod
    def _beat_now(member: Member) -> bool:
        try:
            return member.beat()
        except Exception:  # one console's failure says nothing to the others
            log.warning("a live console failed to take the heartbeat", exc_info=True)
            return True

    async def _run(self, layer: Any) -> None:
        channel = self.channel
        while True:
            try:
                # The layer's own receive: it returns each message as it comes (a heartbeat
                # at least every BEAT_S while anyone listens), or raises when Redis goes
                # (the watch closes the consoles meanwhile). Not cut short by a timeout:
                # channels-redis unsubscribes a channel whose receive is cancelled.
                event = await layer.receive(channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if not self.away:
                    log.warning("the live hub could not receive (%s); retrying", exc)
                await self._away()
                await asyncio.sleep(1)
                continue
            self.deliver(event)

    async def _beat(self, layer: Any) -> None:
        """Send the heartbeat through the layer every BEAT_S while anyone listens, and drop
        the members that took over TAKE_TIMEOUT_S over one event (``_overdue``)."""
        loop = asyncio.get_running_loop()
        failing = False
        due = loop.time() + BEAT_S
        while True:
            await asyncio.sleep(min(BEAT_S, TAKE_TIMEOUT_S / 4))
            self._overdue()
            if loop.time() < due:
                continue
            due = loop.time() + BEAT_S
            if not self.boxes or self.channel is None:
                continue
            try:
                await asyncio.wait_for(layer.send(self.channel, {"type": BEAT}), BEAT_S)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the pages say "stale"; the watch says why
                if not failing:
                    log.info("the live hub's heartbeat was not sent (%r)", exc)
                failing = True
            else:
                failing = False

    def _overdue(self) -> None:
        """Drop each member that has taken over TAKE_TIMEOUT_S over one event (a browser
        that reads nothing through a server that waits, a console that never became ready):
        its task is cancelled and it is told to reconnect."""
        now = asyncio.get_running_loop().time()
        for member, box in list(self.boxes.items()):
            if box.since is not None and now - box.since > TAKE_TIMEOUT_S:
                log.warning(
                    "a live console took over %.0f s over an event: dropped, it reconnects",
                    TAKE_TIMEOUT_S,
                )
                self.drop(member)

    async def _watch(self, layer: Any) -> None:
        """Ping Redis every second; tell the consoles when it is away, subscribe again when back."""

        client = Redis.from_url(settings.REDIS_URL, socket_timeout=PING_TIMEOUT_S)
        try:
            while True:
                await asyncio.sleep(PING_S)
                try:
                    await asyncio.wait_for(client.ping(), PING_TIMEOUT_S)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not self.away:
                        log.warning("the live hub's Redis is away (%s): consoles not live", exc)
                    await self._away()
                    continue
                if self.away:
                    await self._back(layer)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.aclose(), PING_TIMEOUT_S)

    def _forget_shared(self) -> None:
        """Events may have been missed (a new subscription, Redis away): no state made
        before is handed out again."""
        self.epoch += 1
        self.shared.clear()

    async def share(
        self, key: Hashable, groups: list[str], make: Callable[[], Awaitable[T]], timeout: float
    ) -> T:
        """Return what ``make()`` gives, made once for every member asking with the same
        ``key`` (what the state shows, and to whom) while no event of its ``groups`` has
        arrived since it began, and for at most ``SHARE_S``; waited on for at most
        ``timeout`` (TimeoutError past it; the making goes on for the others).

        For the first state of a member that joined the groups: a change committed before
        the state began is in it, and the event of one committed after arrives after, so
        it is in the member's queue (and a later member gets a state made afresh). A
        thousand consoles opening at once, a restarted web process's, read the database
        and render once, not a thousand times.
        """
        loop = asyncio.get_running_loop()
        now = loop.time()
        heard = (self.epoch, *(self.heard[g] for g in groups))
        shared = self.shared.get(key)
        if shared is None or shared.heard != heard or now - shared.at > SHARE_S:
            for old in [k for k, s in self.shared.items() if now - s.at > SHARE_S]:
                del self.shared[old]
            shared = self.shared[key] = Shared(heard, now, loop.create_task(make()))
            shared.task.add_done_callback(lambda t, k=key, s=shared: self._made(k, s, t))
        async with asyncio.timeout(timeout):
            return await asyncio.shield(shared.task)

    def _made(self, key: Hashable, shared: Shared, task: asyncio.Task[Any]) -> None:
        """A state that failed is not handed out again (its callers heard the error)."""
        failed = task.cancelled() or task.exception() is not None
        if failed and self.shared.get(key) is shared:
            del self.shared[key]

    async def _away(self) -> None:
        """Close every console (1013): events are being dropped; they reconnect later."""
        self.away = True
        self._forget_shared()
        try:  # a join under way ends first (it is bounded: the consumer's JOIN_TIMEOUT_S)
            async with asyncio.timeout(TELL_TIMEOUT_S * 2), self.lock:
                members = self._take_all()
        except TimeoutError:
            members = self._take_all()
        await asyncio.gather(*(self._tell(m.layer_lost) for m in members))

    def _take_all(self) -> set[Member]:
        members = set(self.boxes) | {m for group in self.members.values() for m in group}
        for member in members:
            self.leave(member)
        self.members.clear()
        return members

    async def _back(self, layer: Any) -> None:
        """Redis answers again: subscribe again (a Redis that restarted forgot the groups)."""
        try:
            async with asyncio.timeout(PING_TIMEOUT_S * 2), self.lock:
                for group in self.subscribed:
                    await layer.group_add(group, self.channel)
        except Exception as exc:
            log.warning("the live hub could not subscribe again yet (%r)", exc)
            return
        self.away = False
        self._forget_shared()
        log.warning("the live hub's Redis is back: consoles reconnect and resynchronise")


class LayerAway(logging.Filter):
    """channels-redis logs each failed receive with its traceback, once a second per layer
    while Redis is away (``channels_redis.pubsub``): keep one line a minute, with the
    error and without the traceback; the hub says when Redis goes and comes back.
    Connected in the settings' ``LOGGING``."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._said = -self.EVERY_S

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, RedisError | OSError | TimeoutError):
            return True
        now = time.monotonic()
        if now - self._said < self.EVERY_S:
            return False
        self._said = now
        said = record.getMessage()
        record.msg = "%s (%s: %s); said once a minute while Redis does not answer"
        record.args = (said, type(exc).__name__, exc)
        record.exc_info = None
        record.exc_text = None
        return True


_hubs: dict[asyncio.AbstractEventLoop, Hub] = {}


def hub() -> Hub:
    """Return this event loop's hub (one per server process; tests run several loops)."""
    loop = asyncio.get_running_loop()
    h = _hubs.get(loop)
    if h is None:
        for old in [lp for lp in _hubs if lp.is_closed()]:
            del _hubs[old]
        h = _hubs[loop] = Hub()
    return h
