"""What a gateway process holds in memory, and how it stays current.

A thread of the process's own reads the catalog, the ready replicas and the live client
keys (a few queries, never on a request's path), builds a ``gateway.path.table.Table`` and
swaps it in whole. It reads again every ``interval`` seconds (the bound on staleness when
a change event is missed: under a second) and at once when ``poke``d (a change event, a
request for a model with no ready replica). Requests read ``state.table``: one attribute,
no lock, no query.

Demand for a model is written by the same thread, at most once per ``DEMAND_EVERY``
seconds per model however many requests asked (``cluster.services.demand``, which wakes
the reconciler when the model is scaled to zero): so a model with an idle timeout is kept
while it is used, and a model with no replica is started once for any number of requests. Requests waiting for such a model are woken
on their loop when a table with a replica of it arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import close_old_connections, connection
from django.db.models import Max

from catalog.models import ChangeRecord, ServedModel
from catalog.services import stored_specs
from cluster import relay
from cluster.agentinput import AgentError
from cluster.choices import NodeHealth, ReplicaState
from cluster.enginekeys import engine_key
from cluster.models import Quota, Replica
from cluster.services import demand, no_room
from gateway.models import PEER_OWNER, ClientKey, Peer
from gateway.path.table import Key, ReplicaRow, Table, build
from gateway.records import metrics
from guard import snapshots
from llmgw_core import events
from llmgw_core.upstream import Key as UpstreamKey
from llmgw_core.upstream import UpstreamError, split

log = logging.getLogger(__name__)

INTERVAL = 0.5
# The live events that change what the gateway routes by, and how often their groups are
# joined again (channels-redis forgets a group's members after a day).
LISTENED = ("models", "nodes")
REJOIN_EVERY = 600.0
JOIN_WAIT = 10.0  # the longest the listener waits on the layer to join a group
# A model's demand is written at most this often by one process, however many requests
# ask (the reconciler's idle timeouts count in minutes).
DEMAND_EVERY = 5.0


# The whole catalog is read again at least this often, whatever its change log says (a
# safety net for a write that logged nothing).
CATALOG_EVERY = 10.0


class Loader:
    """Reads what the gateway routes by; the catalog only when its change log moved.

    The replicas and the keys are read on every pass (two small queries). The catalog is
    read whole (six queries, and building a thousand models costs a good part of a
    second) only when its change log's newest entry or its count of models changed, or
    every ``CATALOG_EVERY`` seconds. When nothing changed the same table is returned, and
    the state keeps it (its rings are not built again).
    """

    def __init__(self) -> None:
        self._mark: tuple[object, ...] | None = None
        self._models: list[Any] = []
        self._created: dict[str, int] = {}
        self._read_at = 0.0
        self._inputs: tuple[object, ...] | None = None
        self._table: Table | None = None

    def __call__(self) -> Table:
        mark = (ChangeRecord.objects.aggregate(last=Max("id"))["last"], ServedModel.objects.count())
        now = time.monotonic()
        if mark != self._mark or now - self._read_at >= CATALOG_EVERY:
            self._models = stored_specs()
            # When each model was added to the catalog: /v1/models' "created".
            self._created = {
                name: int(at.timestamp())
                for name, at in ServedModel.objects.values_list("name", "created")
            }
            self._mark, self._read_at = mark, now
        found = list(
            Replica.objects.filter(state=ReplicaState.READY, desired=True)
            .exclude(endpoint="")
            .exclude(assignments__node__health=NodeHealth.LOST)
            .values("id", "model_name", "profile", "endpoint")
            .distinct()
        )
        draining = set(
            Replica.objects.filter(
                id__in=[r["id"] for r in found], assignments__node__cordoned=True
            ).values_list("id", flat=True)
        )
        rows = tuple(
            ReplicaRow(r["id"], r["model_name"], r["profile"], r["endpoint"], r["id"] in draining)
            for r in sorted(found, key=lambda r: r["id"])
        )
        unplaced = no_room()
        owner_tpm = dict(Quota.objects.filter(tpm__gt=0).values_list("owner", "tpm"))
        keys = {
            k.digest: Key(
                id=k.id,
                name=k.name,
                owner=k.owner,
                models=tuple(k.models or ()),
                expires=k.expires.timestamp() if k.expires else None,
                rpm=k.rpm,
                tpm=k.tpm,
                priority=k.priority,
                owner_tpm=owner_tpm.get(k.owner, 0) if k.owner else 0,
                replica=k.replica,
                peer=k.owner.startswith(PEER_OWNER),
            )
            for k in ClientKey.objects.filter(revoked__isnull=True)
        }
        # Federated peers whose breaker is open (gateway.peers keeps it): one small query.
        down = dict(Peer.objects.filter(state="tripped").values_list("name", "last_error"))
        inputs = (id(self._models), rows, tuple(sorted(keys.items())),
                  tuple(sorted(unplaced.items())), tuple(sorted(down.items())))  # fmt: skip
        if self._table is not None and inputs == self._inputs:
            return self._table
        self._inputs = inputs
        self._table = build(self._models, rows, keys, unplaced, self._created, down)
        return self._table


def engine_keys(table: Table) -> dict[UpstreamKey, str]:
    """Return each routed replica's engine key (``cluster.enginekeys``) by where it is
    reached: computed when a table is swapped in, never on a request's path."""
    out: dict[UpstreamKey, str] = {}
    for pool in table.pools.values():
        for rid, url in pool.endpoints.items():
            try:
                where, _ = split(url)
            except UpstreamError:
                continue  # not a URL the gateway could call anyway
            out[where] = engine_key(rid)
    return out


def load_table() -> Table:
    """Read what the gateway routes by: catalog, ready replicas, live keys (all of it)."""
    return Loader()()


# How often a state that keeps failing to read says so again.
FAILURE_LOG_EVERY = 60.0
# How long one read may take before the pass gives up on it (the read goes on in its
# thread; the next pass waits for that one rather than starting another): a database
# that hangs is a failed read, said and counted, not a reader stuck without a word.
READ_TIMEOUT = 10.0
# The table is stale when its last read failed, or when it is older than this (a read
# hung): ``/healthz`` says so (gateway.path.health).
STALE_AFTER = 5.0


class State:
    def __init__(
        self,
        loader: Callable[[], Table] | None = None,
        interval: float = INTERVAL,
        record_demand: Callable[[str], None] | None = None,
        keep: Sequence[Any] | None = None,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        self.table = Table()
        self._record = record_demand or record_demand_in_db
        self.loaded = False
        # What else the path reads from memory, kept fresh by this thread after each read
        # of the table (``guard.cache.Cached``: its ``keep``, ``stale`` and ``age``): with
        # the real loader, the guard's policy and judges (``guard.snapshots.kept``).
        if keep is None:
            keep = () if loader is not None else (_guard_snapshot(),)
        self._keep = tuple(keep)
        self._loader = loader or Loader()
        self.read_timeout = read_timeout
        self.read_at: float | None = None  # time.monotonic() of the last good read
        self._failing = False
        self._reading: Future[Table] | None = None
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gateway-state-read")
        self.interval = interval
        self._poke = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._first: asyncio.Event | None = None
        self._demand: set[str] = set()
        self._demanded: dict[str, float] = {}
        self._passes: list[tuple[int, asyncio.Future[None]]] = []
        self._started = 0  # passes begun (written by the thread only)
        self._asked_at = -float("inf")  # when next_pass last poked (the loop's clock)
        self._lock = threading.Lock()
        self.failures = 0
        self._failure_logged = -float("inf")
        self.events = 0
        self.rejoin_every = REJOIN_EVERY  # how long the listener waits before joining again
        self.joins = 0  # times the listener joined the groups
        # Each ready replica's engine key by where it is reached (``engine_key``).
        self._engine_keys: dict[UpstreamKey, str] = {}

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        if self._thread is not None:
            return
        self._loop = loop or asyncio.get_running_loop()
        self._first = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="gateway-state", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._poke.set()
        self._reader.shutdown(wait=False)

    def engine_key(self, upstream: UpstreamKey) -> str | None:
        """Return the engine key of the replica reached at ``upstream`` (scheme, host,
        port), or None: ``llmgw_core.upstream.Upstream``'s credentials. One dict lookup."""
        return self._engine_keys.get(upstream)

    def poke(self) -> None:
        """Read everything again now (a change event arrived)."""
        self._poke.set()

    async def listen(self) -> None:
        """Read again at once when the cluster's live events say something changed.

        The same events the consoles hear (``llmgw_core.events``: Redis in production, this
        process's own layer embedded): a model's replicas or the catalog
        (``cluster.models``), a node cordoned, drained or lost (``cluster.nodes``). A
        missed event costs at most ``interval``: the thread reads again anyway.
        """
        layer = get_channel_layer()
        if layer is None:
            return
        if isinstance(layer, InMemoryChannelLayer):
            if not relay.listening():
                # Embedded, in a process of its own (gateway serve): no event reaches
                # this layer, and this process's own (its traffic) must go to the web
                # process's live.sock, which a home loop here would stop. The poll reads.
                return
            # The embedded web process: its events reach this loop's layer.
            events.set_home_loop(asyncio.get_running_loop())
        groups = [e.group for e in events.EVENTS if e.topic in LISTENED]
        while not self._stop.is_set():
            try:
                # Each call to the layer bounded: a hung Redis is tried again, not waited on.
                channel = await asyncio.wait_for(layer.new_channel("gateway-state."), JOIN_WAIT)
                for group in groups:
                    await asyncio.wait_for(layer.group_add(group, channel), JOIN_WAIT)
                self.joins += 1
                joined = time.monotonic()
                while not self._stop.is_set():
                    # Bounded by the rejoin: a quiet cluster (or a layer that stopped
                    # delivering) still has its groups joined again before they expire.
                    left = joined + self.rejoin_every - time.monotonic()
                    if left <= 0:
                        break  # groups expire in Redis: join them again
                    try:
                        await asyncio.wait_for(layer.receive(channel), left)
                    except TimeoutError:
                        break
                    self.poke()
                    self.events += 1
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("the gateway could not hear change events; retrying", exc_info=True)
                await asyncio.sleep(1)

    def demand(self, model: str, now: float | None = None) -> None:
        """Note that ``model`` was asked for: written by the thread, once per
        ``DEMAND_EVERY`` seconds at most (the first at once)."""
        now = time.monotonic() if now is None else now
        last = self._demanded.get(model)
        if last is not None and now - last < DEMAND_EVERY:
            return
        self._demanded[model] = now
        with self._lock:
            self._demand.add(model)
        self._poke.set()

    async def first_load(self, timeout: float = 30.0) -> bool:
        if self.loaded:
            return True
        if self._first is None:
            self.start()
        assert self._first is not None
        try:
            await asyncio.wait_for(self._first.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def wait_for_pool(self, model: str, timeout: float) -> bool:
        """Wait until a replica of ``model`` is ready (True) or ``timeout`` passes."""
        if self.table.pool(model):
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(model, []).append(future)
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return bool(self.table.pool(model))
        finally:
            waiters = self._waiters.get(model)
            if waiters and future in waiters:
                waiters.remove(future)
        return True

    def waiting(self, model: str) -> int:
        return len(self._waiters.get(model, ()))

    # The thread.
    def _run(self) -> None:
        while not self._stop.is_set():
            self._poke.clear()
            self._pass()
            self._poke.wait(self.interval)

    def age(self) -> float | None:
        """Seconds since the table (and what is kept with it) was last read whole; None
        before the first read."""
        if self.read_at is None:
            return None
        age = time.monotonic() - self.read_at
        for kept in self._keep:
            kept_age = kept.age()
            if kept.stale and kept_age is not None:
                age = max(age, kept_age)
        return age

    @property
    def stale(self) -> bool:
        """Whether this process serves from a table it could not read again: its last read
        failed (or hung), or it is older than ``STALE_AFTER``, or what is kept with it is
        stale. Never before the first read (there is nothing to serve then)."""
        age = self.age()
        if age is None:
            return False
        return self._failing or age > STALE_AFTER or any(k.stale for k in self._keep)

    def _pass(self) -> None:
        self._started += 1
        number = self._started
        try:
            # One read at a time: a read still hung from an earlier pass is waited for
            # again rather than joined by another.
            if self._reading is None or self._reading.done():
                self._reading = self._reader.submit(self._read)
        except RuntimeError:
            # The reader takes no more reads: the process is stopping, however it was told
            # (``stop``, or the interpreter's exit shutting every executor down).
            self._stop.set()
            return
        try:
            table = self._reading.result(timeout=self.read_timeout)
        except Exception as error:
            if self._stop.is_set():
                return  # stopping: the reader was shut down under this pass (SIGTERM)
            if isinstance(error, FutureTimeout):
                error = TimeoutError(f"no answer from the database within {self.read_timeout:g} s")
            self._failed(error)
            if self._loop is not None:
                # Those waiting for this pass (a key not known yet) learn nothing new.
                with contextlib.suppress(RuntimeError):
                    self._loop.call_soon_threadsafe(self._passed, number)
            return
        self.read_at = time.monotonic()
        if self._failing:
            log.warning("the gateway read the catalog and replicas again after %d failed "
                        "reads", self.failures)  # fmt: skip
        self._failing = False
        _note_read("table")
        if not any(k.stale for k in self._keep):
            _note_read("guard")
        changed = table is not self.table
        if changed:
            self._engine_keys = engine_keys(table)
        self.table = table
        if self._loop is not None:
            # A closed loop: the process is stopping.
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._swapped if changed else self._passed, number)

    def _read(self) -> Table:
        """Record the demand noted since, then read the table (in the reader's thread)."""
        close_old_connections()
        try:
            with self._lock:
                wanted, self._demand = self._demand, set()
            try:
                for model in wanted:
                    self._record(model)
            except Exception:
                with self._lock:  # written with the next read
                    self._demand |= wanted
                raise
            table = self._loader()
            for kept in self._keep:
                kept.keep()  # never raises: a failure makes it stale
            return table
        finally:
            connection.close()

    def _failed(self, error: BaseException) -> None:
        self.failures += 1
        self._failing = True
        _note_failure("table")
        # The whole error the first time, then a line a minute: a database away for
        # long must not fill the log twice a second.
        now = time.monotonic()
        if self.failures == 1 or now - self._failure_logged >= FAILURE_LOG_EVERY:
            self._failure_logged = now
            age = self.age()
            old = "" if age is None else f" ({age:.0f} s old)"
            log.error("the gateway could not read the catalog and replicas (%d failed reads "
                      "so far); it serves the last it read%s: %s", self.failures, old, error,
                      exc_info=self.failures == 1)  # fmt: skip

    def _passed(self, number: int) -> None:
        """Pass ``number`` ended (on the loop): wake those waiting for it."""
        still = []
        for target, future in self._passes:
            if target <= number:
                if not future.done():
                    future.set_result(None)
            else:
                still.append((target, future))
        self._passes = still

    async def next_pass(self, timeout: float) -> None:
        """Wait until a pass that starts after now has read everything (or ``timeout``).

        The pass is asked for early at most once an interval: a client sending keys
        nobody made (each one waits for a pass) must not have the database read again
        for every one of them."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._passes.append((self._started + 1, future))
        if loop.time() - self._asked_at >= self.interval:
            self._asked_at = loop.time()
            self.poke()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout)

    def _swapped(self, number: int) -> None:
        self._passed(number)
        self.loaded = True
        if self._first is not None:
            self._first.set()
        for model, waiters in list(self._waiters.items()):
            # Ready, or nowhere to go: either way waiting longer gains nothing.
            if self.table.pool(model) or model in self.table.unplaced:
                for future in waiters:
                    if not future.done():
                        future.set_result(None)


def _guard_snapshot() -> Any:
    return snapshots.kept()


def _note_read(part: str) -> None:
    """Export when ``part`` was last read whole (gateway.records.metrics: the state's series)."""
    with contextlib.suppress(Exception):  # a metric never stops a read
        metrics.state_read(part)


def _note_failure(part: str) -> None:
    with contextlib.suppress(Exception):
        metrics.state_failed(part)


def record_demand_in_db(model: str) -> None:
    """Note that ``model`` was asked for: the reconciler starts it if it is scaled to zero."""
    with contextlib.suppress(AgentError):  # deleted since: nothing to start
        demand(model)
