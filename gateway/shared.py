"""What the gateway processes share through Redis, so that N of them behave as one:
admission's gates and the lower bands' requests in flight and waiting
(``gateway.path.admission``), ejected replicas (``gateway.path.outliers``) and the judges' circuit
breakers (``guard.breaker``).

Nothing here is on a request's path but one call: a request of a lower band that a closed
gate lets in takes its room in Redis (``take``: one script, read the processes' counts,
compare with the allowance, add one), bounded as a budget's call is (``SLOW_FACTOR``
times ``LLMGW_REDIS_TIMEOUT_MS``). An open gate, the top band, routing and the guard ask
Redis nothing; a request's end is written with the next pass.

The rest is a task of the process's own (``run``), every ``EVERY`` seconds, one pipeline:

- this process is alive (a key with a TTL: the others' counts of a process gone are
  dropped by the next ``take``);
- what changed here since its last pass is written: an ejection (its replica, model, the
  Unix time it ends, its level), a breaker opened or closed by an answer (its state), a
  gate whose allowance changed (or that stayed pressed), the lower bands' requests in
  flight (the count as it is, so a pass sets right what an end or a race left) and
  waiting per band, and the last first-token times measured here (the allowance steps on
  the last few of every process's);
- what the others wrote is read and taken up: a replica another process ejected is out of
  routing here too until the same time (``Outliers.adopt``; logged, counted as an
  ejection of this process), a breaker another opened is open here until the same time
  (and one closed there closes here: ``Breakers.adopt``), a gate changed elsewhere is this
  process's gate (``Admission.adopt``), the others' requests in flight and waiting count
  here (``Admission.others``), and their first-token times join this process's last few
  (``Admission.heard_elsewhere``).

So a replica ejected by one process is skipped by the others within ``EVERY`` (plus the
pipeline's round trip), and a breaker opened in one is open in all.

While Redis does not answer (a call refused, cut, or with no answer within the bound),
each process goes on alone at once, as budgets do (``gateway.path.limits``): admission decides
from what it has, ejections and breakers are this process's own; it logs when that starts,
once a minute while it lasts and when it ends, and counts in
``llmgw_gateway_shared_local_total{kind}`` (``admission``: decisions made alone;
``ejection``, ``breaker``: changes that could not be shared). The pass goes on every
``PROBE_S`` as the probe; once Redis answers, this process's current ejections and open
breakers are written (and its counts by the next pass), so what happened alone is shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.path import series
from gateway.path.admission import Gate
from gateway.path.limits import LOG_EVERY_S, SLOW_FACTOR, said, timeout_setting
from guard import breaker, checks
from llmgw_core import rediskeys

if TYPE_CHECKING:
    from gateway.path.admission import Admission
    from gateway.path.outliers import Ejection, Outliers
    from gateway.records.observe import Observer

log = logging.getLogger("gateway")

EVERY = 0.25  # seconds between passes while Redis answers
GAP = 0.05  # the least between two passes (a change here brings the next one forward)
PROBE_S = 1.0  # and while it does not
STOP_S = 2.0  # the most a process's leaving waits for its pass and its connection
ALIVE_S = 3  # a process's key lives this long past its last pass
KEEP_S = 24 * 3600  # the shared hashes live this long past their last write
WAITING_S = 2.0  # another process's waiting counts older than this are past


def prefix() -> str:
    """Where this cluster's shared state lives in Redis: ``llmgw:<cluster>:gateway:shared:``
    (``llmgw_core.rediskeys``: two clusters, or two test runs' databases, that share one
    Redis never read each other's gates, ejections or breakers)."""
    return rediskeys.prefix() + "gateway:shared:"


def _ejected() -> str:
    return prefix() + "ejected"


def _breakers() -> str:
    return prefix() + "breakers"


def _gates() -> str:
    return prefix() + "gates"


def _process(name: str) -> str:
    return f"{prefix()}process:{name}"


def _admitted(model: str) -> str:
    return f"{prefix()}admitted:{model}"


def _waiting(model: str) -> str:
    return f"{prefix()}waiting:{model}"


def _recent(model: str) -> str:
    return f"{prefix()}recent:{model}"


# A lower band's room across the processes: the live processes' counts summed (a process
# whose key is gone is dropped; the caller's is set alive), compared with the allowance less those waiting ahead,
# this process's count up one when it fits. Answers the total after it, or the total
# there is, negated less one, when it does not fit.
_TAKE = """
redis.call('SET', ARGV[4] .. ARGV[1], 1, 'EX', ARGV[6])
local all = redis.call('HGETALL', KEYS[1])
local total = 0
for i = 1, #all, 2 do
  if all[i] == ARGV[1] or redis.call('EXISTS', ARGV[4] .. all[i]) == 1 then
    total = total + math.max(0, tonumber(all[i + 1]))
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
if total + tonumber(ARGV[3]) >= tonumber(ARGV[2]) then return -total - 1 end
redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
redis.call('EXPIRE', KEYS[1], ARGV[5])
return total + 1
"""

# The live processes' counts of a model (a process whose key is gone is dropped, so the
# counts of one that died leave with its key): name, count, name, count ...
_LIVE = """
local all = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #all, 2 do
  if redis.call('EXISTS', ARGV[1] .. all[i]) == 1 then
    live[#live + 1] = all[i]
    live[#live + 1] = all[i + 1]
  else
    redis.call('HDEL', KEYS[1], all[i])
  end
end
return live
"""


def _local_counter() -> Any:
    """``llmgw_gateway_shared_local_total{kind}``, in the gateway's metrics."""
    return series.fallback_counter(
        "shared_local",
        "decisions and changes of this process not shared while Redis was away",
        "the shared state's fallback",
    )


class Shared:
    """One gateway process's share of the state every process holds (module docstring)."""

    def __init__(
        self,
        url: str,
        admission: Admission,
        outliers: Outliers,
        observer: Observer | None = None,
        breakers: breaker.Breakers | None = None,
        *,
        timeout: float | None = None,
        every: float = EVERY,
        probe_every: float = PROBE_S,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout = (timeout_setting() if timeout is None else timeout) * SLOW_FACTOR
        pool = aioredis.BlockingConnectionPool.from_url(
            url, max_connections=64, timeout=self.timeout, socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout, retry=Retry(NoBackoff(), 0),
            health_check_interval=0, lib_name=None, lib_version=None,
        )  # fmt: skip
        self._redis = aioredis.Redis(connection_pool=pool)
        self._take = self._redis.register_script(_TAKE)
        self._live = self._redis.register_script(_LIVE)
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.admission = admission
        self.outliers = outliers
        self.observer = observer
        if breakers is None:
            breakers = checks.BREAKERS
        self.breakers = breakers
        self.every = every
        self.probe_every = probe_every
        self._wall = wall
        self._mono = monotonic
        # What changed here, written by the next pass. Breakers change on threads too.
        self._lock = threading.Lock()
        self._ejections: dict[int, dict[str, Any]] = {}
        self._breakers: dict[str, dict[str, Any]] = {}
        self._gates: dict[str, Gate] = {}
        self._published: dict[str, Gate] = {}  # each gate as last written
        # The last change taken up from the others, per judge and per model (its "at").
        self._breaker_seen: dict[str, float] = {}
        self._gate_seen: dict[str, float] = {}
        self._waited: set[str] = set()  # models whose waiting counts were written last pass
        self._ended: list[str] = []  # ejections over for a minute: deleted by the next pass
        self._counted: set[str] = set()  # models whose count in flight was written not 0
        # Models a take asked Redis of since the last pass: the script may have added one to
        # this process's count there, which only a pass's write of the count takes back.
        self._taken: set[str] = set()
        # The newest of another process's first-token times taken up, per model and process.
        self._recent_seen: dict[tuple[str, bytes], float] = {}
        self.away_since: float | None = None
        self.counted_here = 0
        self._said_at = 0.0
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        # Told to leave: the loop ends at its next turn even if a cancel did not reach it
        # (Python 3.11's ``asyncio.wait_for`` returns instead of raising when a cancel comes
        # just as what it waits for is done), and no pass writes after the leaving's delete.
        self._leaving = False
        self.passes = 0

    # Wiring.
    def start(self) -> None:
        """Join: admission asks through this, breakers' changes are heard, the pass runs."""
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.admission.shared = self
        self.breakers.listen(self._breaker_changed)
        self._task = self._loop.create_task(self.run())

    async def stop(self) -> None:
        """Leave (tests): the pass stops, the process's key goes."""
        self._leaving = True
        if self._task is not None:
            self._task.cancel()
            # Bounded: a pass stuck past its cancel is left to the loop, said once.
            done, _ = await asyncio.wait({self._task}, timeout=STOP_S)
            if not done:
                log.warning("the shared-state pass did not end within %s s of its stop", STOP_S)
        if self.admission.shared is self:
            self.admission.shared = None
        self.breakers.unlisten(self._breaker_changed)
        with contextlib.suppress(Exception):  # its key expires on its own
            await asyncio.wait_for(self._redis.delete(_process(self.name)), self.timeout)
        with contextlib.suppress(Exception):  # a connection that will not close is dropped
            await asyncio.wait_for(self._redis.aclose(), STOP_S)

    @property
    def away(self) -> bool:
        return self.away_since is not None

    # On the request's path: a lower band's room while its gate is closed.
    async def take(self, model: str, limit: int, ahead: int) -> int | None:
        """Take one of ``model``'s lower bands' ``limit`` in flight across the processes,
        ``ahead`` waiting before it. Returns the total in flight after it, or the total
        there is negated less one when there is no room; None while Redis is away (this
        process decides alone)."""
        if self.away_since is None:
            added = True  # unless Redis says there was no room
            try:
                total = int(
                    await asyncio.wait_for(
                        self._take(keys=[_admitted(model)],
                                   args=[self.name, limit, ahead, _process(""), KEEP_S,
                                         ALIVE_S]),
                        self.timeout,
                    )
                )  # fmt: skip
                added = total > 0
                return total
            except Exception as exc:
                self._went_away(exc)
            finally:
                if added:
                    # One added to this process's count in Redis (or maybe: cut, timed
                    # out, cancelled): the next pass writes the count as it is, even if the
                    # request has ended by then (its end, with no pass between, is written
                    # nowhere else).
                    self._taken.add(model)
        self._alone("admission")
        return None

    # Changes here, written by the next pass.
    def gate_changed(self, model: str, before: Gate, after: Gate) -> None:
        """A model's gate changed here (``Admission.check``): written when its allowance
        changed, or it was pressed again a quarter window after it was last written."""
        last = self._published.get(model)
        if last is not None and last.limit == after.limit:
            if after.limit is None or after.pressed - last.pressed < self.admission.window / 4:
                return
        elif last is None and after.limit is None:
            return
        self._published[model] = after
        self._gates[model] = after
        self._poke()

    def ejected(self, model: str, replica: int, ejection: Ejection) -> None:
        """This process ejected ``replica`` (``Routing.replica_failed``)."""
        if self.away_since is not None:
            self._alone("ejection")
            return
        self._ejections[replica] = {
            "model": model, "until": self._wall() + ejection.seconds, "level": ejection.level,
            "by": self.name,
        }  # fmt: skip
        self._poke()

    def _breaker_changed(self, judge: str, state: breaker.State) -> None:
        """A breaker changed here (any thread): an opening, or a closing by an answer, is
        shared; one taken from another process is not written back."""
        if state.state == breaker.HALF_OPEN or self.breakers.adopted(judge, state):
            return
        if self.away_since is not None:
            self._alone("breaker")
            return
        with self._lock:
            self._breakers[judge] = dict(asdict(state), at=self._wall(), by=self.name)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(self._poke)

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # The pass.
    async def run(self) -> None:
        """Pass every ``every`` seconds (``probe_every`` while Redis is away), or at once
        when something changed here; ends by cancel or once told to leave (``stop``)."""
        assert self._wake is not None
        while not self._leaving:
            every = self.every if self.away_since is None else self.probe_every
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), every)
            self._wake.clear()
            if self._leaving:
                return
            try:
                await self.once()
            except Exception as exc:  # the pass's own bug: said, and the next pass goes on
                log.exception("the gateway processes' shared state could not be read: %s", exc)
            await asyncio.sleep(GAP)

    async def once(self) -> None:
        """One pass: written, read, taken up (Redis away: back once it answers)."""
        if self.away_since is not None:
            try:
                await asyncio.wait_for(self._redis.ping(), self.timeout)
            except Exception:
                return
            await self._back()
            if self.away_since is not None:
                return
        with self._lock:
            breakers, self._breakers = self._breakers, {}
        ejections, self._ejections = self._ejections, {}
        gates, self._gates = self._gates, {}
        taken, self._taken = self._taken, set()
        counts = self.admission.shared_counts()
        # A model taken in Redis and over here since (gate open, nothing in flight): its
        # count, 0, is written all the same.
        for model in taken - counts.keys():
            counts[model] = (0, {})
        now_wall, now_mono = self._wall(), self._mono()
        pipe = self._redis.pipeline(transaction=False)
        pipe.set(_process(self.name), 1, ex=ALIVE_S)
        if self._ended:
            pipe.hdel(_ejected(), *self._ended)
            self._ended = []
        for replica, entry in ejections.items():
            pipe.hset(_ejected(), str(replica), json.dumps(entry))
        if ejections:
            pipe.expire(_ejected(), KEEP_S)
        for judge, entry in breakers.items():
            pipe.hset(_breakers(), judge, json.dumps(entry))
        if breakers:
            pipe.expire(_breakers(), KEEP_S)
        for model, gate in gates.items():
            entry = {"limit": gate.limit, "by": self.name, "at": now_wall,
                     "pressed": now_wall - (now_mono - gate.pressed),
                     "stepped": now_wall - (now_mono - gate.stepped)}  # fmt: skip
            pipe.hset(_gates(), model, json.dumps(entry))
            self._gate_seen[model] = now_wall
        if gates:
            pipe.expire(_gates(), KEEP_S)
        waited, counted = set(), set()
        for model, (lower, waiting) in counts.items():
            if lower or model in self._counted or model in taken:
                # This process's count, as it is (the takes' increments since the last
                # pass are in it): what a request ended gives back (one that ended before
                # a pass saw it in flight too: its take marked the model), and what a take
                # met by this write lost is set right within a pass.
                pipe.hset(_admitted(model), self.name, lower)
                pipe.expire(_admitted(model), KEEP_S)
                if lower:
                    counted.add(model)
            recent = [[now_wall - (now_mono - at), ms] for at, ms in self.admission.recent(model)]
            if recent:
                pipe.hset(_recent(model), self.name, json.dumps(recent))
                pipe.expire(_recent(model), KEEP_S)
            if waiting or model in self._waited:
                pipe.hset(_waiting(model), self.name, json.dumps({"at": now_wall, "w": waiting}))
                pipe.expire(_waiting(model), KEEP_S)
                if waiting:
                    waited.add(model)
        pipe.hgetall(_ejected())
        pipe.hgetall(_breakers())
        pipe.hgetall(_gates())
        models = list(counts)
        for model in models:
            await self._live(keys=[_admitted(model)], args=[_process("")], client=pipe)
            pipe.hgetall(_waiting(model))
            pipe.hgetall(_recent(model))
        try:
            answers = await asyncio.wait_for(pipe.execute(), self.timeout)
        except Exception as exc:
            # Not written: what changed here stays this process's (said, and counted);
            # the counts taken are written by the first pass that goes through.
            self._taken |= taken
            for kind, n in (("ejection", len(ejections)), ("breaker", len(breakers))):
                for _ in range(n):
                    self._alone(kind)
            self._went_away(exc)
            return
        finally:
            with contextlib.suppress(Exception):  # bounded: the pipe's connection is dropped
                await asyncio.wait_for(pipe.reset(), self.timeout)
        self._waited, self._counted = waited, counted
        self.passes += 1
        reads = answers[len(answers) - 3 - 3 * len(models) :]
        self._take_ejections(reads[0], now_wall, now_mono)
        await self._take_breakers(reads[1], now_wall)
        self._take_gates(reads[2], now_wall, now_mono)
        for i, model in enumerate(models):
            admitted, waiting, recent = reads[3 + 3 * i : 6 + 3 * i]
            self._take_counts(model, admitted, waiting, now_wall)
            self._take_recent(model, recent, now_wall, now_mono)

    # Taking up what the others wrote.
    def _take_ejections(self, found: dict[bytes, bytes], now_wall: float,
                        now_mono: float) -> None:  # fmt: skip
        for replica_, raw in found.items():
            try:
                entry = json.loads(raw)
                replica, until = int(replica_), float(entry["until"])
            except (ValueError, KeyError, TypeError):
                continue
            if until <= now_wall:
                if until < now_wall - 60:
                    self._ended.append(replica_.decode())
                continue
            if entry.get("by") == self.name:
                continue
            model = str(entry.get("model", ""))
            seconds = until - now_wall
            if self.outliers.adopt(model, replica, now_mono + seconds,
                                   int(entry.get("level", 1)), now_mono):  # fmt: skip
                log.warning("replica %d of %s ejected from routing for %.0f s by another "
                            "gateway process (%s)", replica, model, seconds,
                            entry.get("by", "?"))  # fmt: skip
                if self.observer is not None:
                    self.observer.ejected(model, replica, seconds, until)

    async def _take_breakers(self, found: dict[bytes, bytes], now_wall: float) -> None:
        taken: list[tuple[str, breaker.State]] = []
        for judge_, raw in found.items():
            judge = judge_.decode(errors="replace")
            try:
                entry = json.loads(raw)
                at, by = float(entry.pop("at")), entry.pop("by", "")
                state = breaker.State(**entry)
            except (ValueError, KeyError, TypeError):
                continue
            if by == self.name or at <= self._breaker_seen.get(judge, 0.0):
                continue
            self._breaker_seen[judge] = at
            mine = self.breakers.state(judge).state
            if state.state == breaker.OPEN:
                if (state.next_probe or 0.0) <= now_wall:
                    continue  # its back-off is over: each process probes it on its own
            elif state.state != breaker.CLOSED or mine == breaker.CLOSED:
                continue
            taken.append((judge, state))
        if taken:
            # Its listeners may write (the console's record where no recorder runs): off
            # the loop, bounded.
            await asyncio.wait_for(asyncio.to_thread(self._adopt_breakers, taken), 10)

    def _adopt_breakers(self, taken: list[tuple[str, breaker.State]]) -> None:
        for judge, state in taken:
            self.breakers.adopt(judge, state)
            log.warning("judge %s: its circuit breaker is %s, as another gateway process "
                        "found it", judge, state.state.replace("_", "-"))  # fmt: skip

    def _take_gates(self, found: dict[bytes, bytes], now_wall: float, now_mono: float) -> None:
        for model_, raw in found.items():
            model = model_.decode(errors="replace")
            try:
                entry = json.loads(raw)
                at = float(entry["at"])
                limit = None if entry["limit"] is None else int(entry["limit"])
                pressed, stepped = float(entry["pressed"]), float(entry["stepped"])
            except (ValueError, KeyError, TypeError):
                continue
            if entry.get("by") == self.name or at <= self._gate_seen.get(model, 0.0):
                continue
            self._gate_seen[model] = at
            gate = self.admission.gates().get(model)
            if limit is None and gate is None:
                continue  # open, and nothing of it here: nothing to take up
            pressed_here = now_mono - (now_wall - pressed)
            if limit is not None and (gate is None or gate.limit is None):
                if now_mono - pressed_here >= self.admission.window:
                    continue  # a gate left closed long ago: over
                log.warning("model %s is under pressure, as another gateway process found it: "
                            "its lower bands get at most %d in flight", model, limit)  # fmt: skip
            self.admission.adopt(model, limit, pressed_here, now_mono - (now_wall - stepped))
            self._published[model] = Gate(limit, now_mono - (now_wall - pressed))

    def _take_counts(self, model: str, live: list[bytes],
                     waiting: dict[bytes, bytes], now_wall: float) -> None:  # fmt: skip
        me = self.name.encode()
        lower = 0
        for name, n in zip(live[::2], live[1::2], strict=True):
            if name != me:
                try:
                    lower += max(0, int(n))
                except ValueError:
                    continue
        bands: dict[str, int] = {}
        for name, raw in waiting.items():
            if name == me:
                continue
            try:
                entry = json.loads(raw)
                if now_wall - float(entry["at"]) > WAITING_S:
                    continue
                for band, n in entry["w"].items():
                    bands[band] = bands.get(band, 0) + int(n)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        self.admission.others(model, lower, bands)

    def _take_recent(self, model: str, found: dict[bytes, bytes], now_wall: float,
                     now_mono: float) -> None:  # fmt: skip
        me = self.name.encode()
        samples = []
        for name, raw in found.items():
            if name == me:
                continue
            seen = self._recent_seen.get((model, name), 0.0)
            try:
                pairs = [(float(at), float(ms)) for at, ms in json.loads(raw)]
            except (ValueError, TypeError):
                continue
            newer = [(at, ms) for at, ms in pairs if at > seen]
            if newer:
                self._recent_seen[(model, name)] = max(at for at, _ in newer)
                samples += [(now_mono - (now_wall - at), ms) for at, ms in newer]
        if len(self._recent_seen) > 10000:
            self._recent_seen.clear()
        self.admission.heard_elsewhere(model, samples)

    # Redis away, and back.
    def _alone(self, kind: str) -> None:
        self.counted_here += 1
        counter = _local_counter()
        if counter is not None:
            counter.labels(kind).inc()
        now = self._mono()
        if self.away_since is not None and now - self._said_at >= LOG_EVERY_S:
            self._said_at = now
            log.warning(
                "admission, ejections and judge breakers are still this gateway process's "
                "alone: Redis has not answered for %.0f s", now - self.away_since,
            )  # fmt: skip

    def _went_away(self, exc: BaseException) -> None:
        if self.away_since is not None:
            return
        self.away_since = self._said_at = self._mono()
        log.warning(
            "admission, ejections and judge breakers are this gateway process's alone while "
            "Redis does not answer (%s within %.0f ms); asking it again every %g s",
            said(exc), self.timeout * 1000, self.probe_every,
        )  # fmt: skip
        # The others' counts are not heard while away: this process's own decide.
        for model in self.admission.shared_counts():
            self.admission.others(model, 0, {})

    async def _back(self) -> None:
        """Redis answers: this process's current ejections and open breakers written, and
        shared from now on (its counts in flight are written by the next pass)."""
        assert self.away_since is not None
        away_for = self._mono() - self.away_since
        now_wall, now_mono = self._wall(), self._mono()
        pipe = self._redis.pipeline(transaction=False)
        out = self.outliers.out(now_mono)
        for model, replicas in out.items():
            for replica, until in replicas.items():
                health = self.outliers.ejected.get(replica)
                entry = {"model": model, "until": now_wall + (until - now_mono),
                         "level": health.level if health else 1, "by": self.name}  # fmt: skip
                pipe.hset(_ejected(), str(replica), json.dumps(entry))
        for judge, state in self.breakers.states().items():
            if state.state == breaker.OPEN:
                entry = dict(asdict(state), at=now_wall, by=self.name)
                pipe.hset(_breakers(), judge, json.dumps(entry))
        try:
            await asyncio.wait_for(pipe.execute(), self.timeout)
        except Exception:
            return  # still away: the next probe tries again
        finally:
            with contextlib.suppress(Exception):  # bounded: the pipe's connection is dropped
                await asyncio.wait_for(pipe.reset(), self.timeout)
        self.away_since = None
        log.warning(
            "admission, ejections and judge breakers are shared in Redis again after %.0f s "
            "(%d decisions and changes made by this process alone)",
            away_for, self.counted_here,
        )  # fmt: skip
        self.counted_here = 0
