"""Admission by priority band: while a model is under pressure (its recent TTFT p99 past
its ``slo``), the bands below the top get an allowance of requests in flight, found as TCP
and Envoy's adaptive concurrency find theirs; past it they wait at the door, briefly, then
get 429.

A client key has a band (``high``, ``normal``, ``low``; ``ClientKey.priority``). Each
gateway process keeps, per model, the first-token times of the requests it admitted over
the last ``window`` seconds (a histogram per second on ``gateway.records.traffic``'s edges, and
the last ``RECENT`` of them as they were; the time a request waited here is taken off, so
a hold does not feed itself) and how many of its requests are in flight, and decides from
them alone: no database, no Redis, a few dictionary look-ups (``bench/autoscale.py``
prints the decision's p50).

The gate of a model (``Gate``, stepped only by ``Gate.step``, pure):

- open (``limit`` None) while the window's p99 is within the slo: every band in;
- the window's p99 past the slo puts the model under pressure: the bands below the top
  get an allowance, ``limit``, of requests in flight (half those in flight then);
- then at most once a ``STEP``: the last ``RECENT`` first-token times past the slo halve
  the allowance (multiplicative decrease); all of them under ``HEADROOM`` of the slo, or
  nothing live of the model in flight here for a ``STEP`` (whatever was heard before; a
  batch line left in flight does not count), while a
  lower band waits for room, add one (additive increase); in between it stays (a dead band, as TCP Vegas', so a band does
  not keep probing past what the slo allows and the top band pay for each probe);
- a whole window with the p99 within the slo and no lower band kept waiting: open again
  (the batch band's allowance from 0).

``high`` (the top band) is always admitted. Within the allowance ``normal`` goes first: a
``low`` request goes in only if the waiting ``normal`` ones leave room.

Below ``low`` is ``batch``, the band of a batch's lines (``gateway.batch``; no key has
it), which only fills what live traffic leaves and yields entirely before any live band is
capped. Its own allowance (``Gate.batch``, None: no cap) is stepped while the live bands
are open, as LEDBAT (RFC 6817) steps a background flow on the delay it adds: each process
keeps a base of the model's live first-token times, the lowest of the per-minute medians of
those measured with no batch line in flight here, over the last ``BASE_MINUTES`` minutes;
no live first token in the window, no cap; one of the last ``RECENT`` past the slo, 0 at
once; then at most once a ``STEP``, the median of the last ``FILTER`` live first tokens past
base × (1 + margin) (``LLMGW_ADMISSION_BATCH_MARGIN``), or one of the last past ``QUIET`` of
the slo, halves it; that median within it while a line waits adds one (no base yet: all of
the last under ``QUIET`` of the slo; or nothing in flight for a step). It is 0 while the
live bands have an allowance, and a line goes in only while no live request waits. The
model past its slo with a batch line here within the window does not cap the live bands:
the batch is cut to 0 first, and the live bands get their allowance only if the first
tokens are still past the slo a step after the last batch line here ended. Batch lines in
flight are not in ``lower`` (they never take a live band's room), and their own first-token
times are not heard (their wait is no client's).

A held request waits up to ``queue`` seconds for room (at most ``queue_max`` waiting a
model across the gateway processes; past it, refused at once; a live request counts only
the live ones waiting, so batch lines at the door never take its place), then is refused: 429 with
``Retry-After`` (the window), ``x-should-retry: true`` and a message naming the band, the
p99 and the slo. Admitted and held requests are counted per model, band and second
(``Counts``) and ride the traffic event to the console's Traffic page.

With Redis (``gateway.shared``), the gateway processes act as one: a gate that changes in
one is taken up by the others (within a quarter second), each process's lower bands in
flight and waiting are written there every quarter second and the others' read back (so
``lower`` is every process's), and a lower band's request a closed gate lets in takes its
room in Redis with one bounded script (``Shared.take``: read the processes' counts,
compare with the allowance, add one), so N processes admit what one would. An open gate
(the usual case) and the top band ask Redis nothing on the request's path. While Redis
does not answer, each process decides alone, as above, and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cluster.scaling import quantile_ms
from gateway.records.observe import Done
from gateway.records.observe import Listener as _Listener

BANDS = ("high", "normal", "low", "batch")  # top first
# The band a batch's lines run in (``gateway.batch.token``), below every key's: no key
# has it, and it only fills what the live bands leave.
BATCH = BANDS[-1]
DEFAULT_BAND = "normal"
RANK = {b: i for i, b in enumerate(BANDS)}
# Histogram edges in ms, the last bucket everything above: the gateway's one set
# (gateway.records.traffic, cluster.load and the traffic history read these).
EDGES_MS = (5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000,
            5000, 10000, 30000, 60000)  # fmt: skip
WINDOW = 10.0
QUEUE = 2.0
QUEUE_MAX = 100
# How often a held request looks at its gate again when nothing wakes it.
RECHECK = 0.1
# The allowance's control: how many recent first-token times it reads, how often at most
# it changes, what a cut keeps of it, and under what share of the slo they must all be
# for it to grow.
RECENT = 3
STEP = 1.0
BETA = 0.5
HEADROOM = 0.5
# The share of the slo the live bands' last first tokens must stay under for the batch band
# to grow (past it the batch's allowance halves; past the slo it is 0): a batch keeps live
# traffic well inside its slo, not at it.
QUIET = 0.8
# The batch band's LEDBAT control: the live first tokens its median is read over, the
# minutes the base is the lowest per-minute median of (a minute counts with BASE_SAMPLES
# first tokens measured with no batch line in flight, at most BASE_KEEP of them kept), and
# the share over the base the median may reach for the batch to grow.
FILTER = 9
BASE_MINUTES = 10
BASE_SAMPLES = 5
BASE_KEEP = 1000
MARGIN = 0.05

# Whether the running request was held and refused (the traffic history counts it).
was_held: contextvars.ContextVar[bool] = contextvars.ContextVar("admission_was_held",
                                                                default=False)  # fmt: skip
# Seconds the running request waited at the door (taken off its TTFT when it ends).
held_for: contextvars.ContextVar[float] = contextvars.ContextVar("admission_held_for",
                                                                 default=0.0)  # fmt: skip
# The model the running request was admitted to, whether of a live lower band and whether a
# batch's line (counted in flight until it ends).
taken: contextvars.ContextVar[tuple[str, bool, bool] | None] = contextvars.ContextVar(
    "admission_taken", default=None
)


def bucket(ms: float) -> int:
    return bisect_left(EDGES_MS, ms)


def quantile(counts: list[int], q: float) -> float | None:
    """The upper edge (ms) of the bucket holding quantile ``q``; None with no sample;
    ``inf`` past the last edge (never optimistic): ``cluster.scaling.quantile_ms`` on
    these edges, the one reading of the gateway's histograms."""
    return quantile_ms(EDGES_MS, counts, q)


def lower(band: str) -> bool:
    """Whether ``band`` is below the top one (an unknown band counts as the default)."""
    return RANK.get(band, RANK[DEFAULT_BAND]) > 0


def live_lower(band: str) -> bool:
    """Whether ``band`` is a live band below the top one (``normal``, ``low``): the bands
    the allowance ``Gate.limit`` holds."""
    return lower(band) and band != BATCH


class Reading(NamedTuple):
    """What a process knows of a model when it decides (plain data)."""

    p99_ms: float | None  # the window's TTFT p99, None with no sample
    recent: tuple[float, ...]  # the last RECENT first-token times (ms) within the window
    slo_ms: float
    lower: int = 0  # requests of the live lower bands in flight (every process's, shared)
    idle: float = 0.0  # seconds with nothing of the model in flight here (0: some)
    batch: int = 0  # batch lines in flight here
    batch_idle: float = float("inf")  # seconds since a batch line was last in flight here
    base_ms: float | None = None  # live first tokens' base without a batch (None: not yet)
    live_ms: float | None = None  # the median of the last FILTER live first tokens
    margin: float = MARGIN  # the share over the base the batch may add
    # Seconds with no live request of the model in flight here (batch lines may be): what
    # the live bands' allowance grows on (0: take ``idle``).
    live_idle: float = 0.0

    @property
    def based(self) -> bool:
        """A base and a median of live first tokens to step the batch on."""
        return self.base_ms is not None and self.live_ms is not None

    @property
    def over_base(self) -> bool:
        """Live first tokens past base × (1 + margin): the batch adds delay, it gives way."""
        return self.based and self.live_ms > self.base_ms * (1 + self.margin)  # type: ignore[operator]

    @property
    def batch_near(self) -> bool:
        """A batch line runs here, or ran within a step: the batch may be what is slow."""
        return bool(self.batch) or self.batch_idle < STEP

    @property
    def batch_in_window(self) -> bool:
        """A batch line ran here within the window (``WINDOW``): its own time may be in
        the p99."""
        return bool(self.batch) or self.batch_idle < WINDOW

    @property
    def over(self) -> bool:
        return bool(self.slo_ms) and self.p99_ms is not None and self.p99_ms > self.slo_ms

    @property
    def slow(self) -> bool:
        """The last first tokens came past the slo."""
        return bool(self.recent) and max(self.recent) > self.slo_ms

    @property
    def room(self) -> bool:
        """Room to grow: the last RECENT first tokens all under HEADROOM of the slo."""
        return len(self.recent) >= RECENT and max(self.recent) < HEADROOM * self.slo_ms

    @property
    def quiet(self) -> bool:
        """Room for the batch: the last RECENT first tokens all under QUIET of the slo."""
        return len(self.recent) >= RECENT and max(self.recent) < QUIET * self.slo_ms

    @property
    def loud(self) -> bool:
        """One of the last first tokens past QUIET of the slo: the batch gives way."""
        return bool(self.recent) and max(self.recent) >= QUIET * self.slo_ms


class Gate(NamedTuple):
    """A model's gate: ``limit`` the live lower bands' allowance in flight (None: open,
    no cap), ``pressed`` the last time it was under pressure (p99 past the slo, or a live
    lower band kept waiting), ``stepped`` the last time an allowance changed (monotonic),
    ``batch`` the batch band's allowance in flight (None: no cap; held at 0 whenever
    ``limit`` is set)."""

    limit: int | None = None
    pressed: float = 0.0
    stepped: float = 0.0
    batch: int | None = None

    @property
    def open(self) -> bool:
        return self.limit is None and self.batch is None

    def step(self, r: Reading, now: float, window: float, wanting: bool = False,
             batch_wanting: bool = False) -> Gate:  # fmt: skip
        """The gate at ``now`` after ``r``; ``wanting``: a live lower band waits for room,
        ``batch_wanting``: a batch line does (which never keeps the model under pressure)."""
        if not r.slo_ms:
            return self if self.open else Gate()
        if self.limit is None:
            if r.over and (not r.batch_in_window or (r.slow and not r.batch_near)):
                # Past the slo with no batch line in the window, or still slow a step
                # after the last one ended: the live lower bands get an allowance.
                return Gate(int(r.lower * BETA), now, now, 0)
            batch, stepped = _batch(self.batch, r, now, self.stepped, batch_wanting)
            if (stepped, batch) == self[2:]:
                return self
            return Gate(None, self.pressed, stepped, batch)
        pressed = now if (r.over or wanting) else self.pressed
        if not r.over and now - pressed >= window:
            # Open again; a batch starts again from nothing and grows as live traffic
            # leaves room.
            return Gate(None, pressed, now, 0)
        limit, stepped = self.limit, self.stepped
        if now - stepped >= STEP:
            limit, stepped = _stepped(limit, r, now, stepped, wanting)
        if (limit, pressed, stepped) == self[:3]:
            return self
        return Gate(limit, pressed, stepped, 0)

    def room(self, band: str, r: Reading, ahead: int = 0) -> bool:
        """Whether ``band`` fits now, ``ahead`` requests of higher lower bands waiting
        before it (the top band always does; a batch line only while the live bands are
        not capped and none waits)."""
        if not lower(band):
            return True
        if band == BATCH:
            if self.limit is not None or ahead:
                return False
            return self.batch is None or r.batch < self.batch
        if self.limit is None:
            return True
        return r.lower + ahead < self.limit

    def allowance(self, band: str) -> int | None:
        """The allowance ``band`` is held to (None: no cap)."""
        if not lower(band):
            return None
        if band == BATCH:
            return 0 if self.limit is not None else self.batch
        return self.limit


def _batch(batch: int | None, r: Reading, now: float, stepped: float,
           wanting: bool) -> tuple[int | None, float]:  # fmt: skip
    """The batch band's allowance while the live bands are open: no live first token in
    the window, no cap (nothing to keep fast); one of the last past the slo, 0 at once
    (the batch yields entirely); then at most once a ``STEP``: the live median past base ×
    (1 + margin), or one of the last past ``QUIET`` of the slo, halves it (at once if it
    had no cap); the median
    within it (no base yet: all of the last ``RECENT`` under ``QUIET`` of the slo), or
    nothing of the model in flight for a step, while a batch line waits: one more. It never
    grows while the median is past base × (1 + margin)."""
    if not r.recent:
        return None, stepped
    if r.slow:
        return (0, now) if batch != 0 else (batch, stepped)
    gives = r.loud or r.over_base
    if now - stepped < STEP and (batch is not None or not gives):
        return batch, stepped  # at most one change a step (an uncapped batch capped at once)
    if batch is None:
        batch = r.batch
    if gives:
        return (int(batch * BETA), now) if batch else (0, stepped)
    if wanting and (r.based or r.quiet or r.idle >= STEP):
        return batch + 1, now
    return batch, stepped


def _stepped(limit: int, r: Reading, now: float, stepped: float,
             wanting: bool) -> tuple[int, float]:  # fmt: skip
    """An allowance a step on: the last first tokens past the slo halve it; nothing live of
    the model in flight for a step, or room under ``HEADROOM``, while its band waits: one
    more; else as it was."""
    if wanting and max(r.idle, r.live_idle) >= STEP:
        # Nothing live here to keep within the slo (a batch line left in flight takes no
        # live band's room: the live bands never wait on it).
        return limit + 1, now
    if r.slow:
        return (int(limit * BETA), now) if limit else (limit, stepped)
    if wanting and r.room:
        return limit + 1, now
    return limit, stepped


class Decision(NamedTuple):
    admit: bool
    limit: int | None  # the band's allowance then (None: no cap)
    p99_ms: float | None
    slo_ms: float


def decide(gate: Gate, band: str, r: Reading, now: float, window: float,
           ahead: int = 0) -> tuple[Gate, Decision]:  # fmt: skip
    """Step ``gate`` with what is known and say whether ``band`` goes in (pure)."""
    wanting = lower(band) and not gate.room(band, r, ahead)
    if band == BATCH:
        gate = gate.step(r, now, window, batch_wanting=wanting)
    else:
        gate = gate.step(r, now, window, wanting)
    admit = gate.room(band, r, ahead)
    if not admit and band != BATCH and gate.pressed != now:
        gate = gate._replace(pressed=now)  # kept waiting: still under pressure
    return gate, Decision(admit, gate.allowance(band), r.p99_ms, r.slo_ms)


def reason(band: str, model: str, decision: Decision, window: float) -> str:
    """What a refused client is told: the band, the p99 and the slo."""
    p = decision.p99_ms
    if p is None:
        seen = "no first token"
    else:
        seen = f"TTFT p99 {'over 60000' if p == float('inf') else f'{p:.0f}'} ms"
    if band == BATCH:
        return (
            f"The model '{model}' is under pressure ({seen} over the last {window:g} s, "
            f"slo {decision.slo_ms:.0f} ms) or live requests wait for it, so batch lines "
            f"get at most {decision.limit or 0} in flight and those are taken: the line "
            "goes again in 1 s."
        )
    return (
        f"The model '{model}' is under pressure ({seen} over the last {window:g} s, slo "
        f"{decision.slo_ms:.0f} ms), so requests of the {band!r} band get "
        f"at most {decision.limit} in flight and those are taken: try again in "
        f"{max(1, round(window))} s, or use a key of a higher band."
    )


@dataclass
class _Model:
    gate: Gate = field(default_factory=Gate)
    # second -> TTFT histogram of that second
    seconds: dict[int, list[int]] = field(default_factory=dict)
    # the last RECENT first tokens: (when, ms)
    recent: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    # Of them, the ones measured here (what gateway.shared tells the other processes).
    mine: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    lower: int = 0  # live lower bands in flight
    busy: int = 0  # every band in flight
    idle_since: float = 0.0  # when busy last fell to 0
    live_since: float = 0.0  # when the live requests in flight last fell to 0
    batch: int = 0  # batch lines in flight
    batch_since: float = -float("inf")  # when the last batch line ended
    waiting: dict[str, int] = field(default_factory=dict)
    opened: asyncio.Event | None = None
    # Across the gateway processes (gateway.shared): the other processes' lower bands in
    # flight and waiting, as last heard.
    others: int = 0
    others_waiting: dict[str, int] = field(default_factory=dict)
    # The batch band's LEDBAT figures: the last FILTER live first tokens here (when, ms),
    # the median of each past minute's measured with no batch line in flight (minute ->
    # ms), and the running minute's such first tokens, sorted.
    live: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=FILTER))
    medians: dict[int, float] = field(default_factory=dict)
    minute: int = 0
    clean: list[float] = field(default_factory=list)

    def base(self, minute: int) -> float | None:
        """The lowest per-minute median of the last BASE_MINUTES (this one's if it has
        BASE_SAMPLES first tokens): the live first tokens' time without a batch; none
        within them (a batch that never let up), the newest there was."""
        medians = dict(self.medians)
        if len(self.clean) >= BASE_SAMPLES:
            medians[self.minute] = self.clean[len(self.clean) // 2]  # the last minute heard
        if not medians:
            return None
        values = [ms for m, ms in medians.items() if minute - m < BASE_MINUTES]
        return min(values) if values else medians[max(medians)]

    def clean_sample(self, minute: int, ms: float) -> None:
        """A live first token measured with no batch line in flight here."""
        if minute != self.minute:
            if len(self.clean) >= BASE_SAMPLES:
                self.medians[self.minute] = self.clean[len(self.clean) // 2]
            newest = max(self.medians, default=None)
            for m in [m for m in self.medians if minute - m >= BASE_MINUTES and m != newest]:
                del self.medians[m]
            self.minute, self.clean = minute, []
        if len(self.clean) < BASE_KEEP:
            insort(self.clean, ms)


class Counts:
    """Admitted and held requests per (second, model, band), taken once a second by the
    traffic publisher (``gateway.records.traffic``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seconds: dict[int, dict[str, dict[str, list[int]]]] = {}

    def add(self, second: int, model: str, band: str, held: bool) -> None:
        with self._lock:
            models = self._seconds.setdefault(second, {})
            if model not in models and len(models) >= 100:
                return
            pair = models.setdefault(model, {}).setdefault(band, [0, 0])
            pair[1 if held else 0] += 1

    def take(self, before: int) -> dict[int, dict[str, dict[str, list[int]]]]:
        """The finished seconds: {second: {model: {band: [admitted, held]}}}."""
        with self._lock:
            done = [s for s in self._seconds if s < before]
            return {s: self._seconds.pop(s) for s in done}


COUNTS = Counts()


class Admission:
    """One process's admission: the recent TTFTs per model, what is in flight, the gates."""

    def __init__(
        self,
        window: float = WINDOW,
        queue: float = QUEUE,
        queue_max: int = QUEUE_MAX,
        clock: Callable[[], float] = time.monotonic,
        counts: Counts | None = COUNTS,
        wall: Callable[[], float] = time.time,
        margin: float = MARGIN,
    ) -> None:
        self.window = window
        self.margin = margin
        self.queue = queue
        self.queue_max = queue_max
        self._clock = clock
        self._wall = wall
        self.counts = counts
        self._models: dict[str, _Model] = {}
        # The gateway processes' shared state (gateway.shared.Shared), None: this
        # process alone.
        self.shared: Any = None

    @classmethod
    def from_settings(cls, settings: Any) -> Admission:
        """The settings' (``django.conf.settings`` or anything with those names)."""
        return cls(
            window=float(settings.LLMGW_ADMISSION_WINDOW),
            queue=float(settings.LLMGW_ADMISSION_QUEUE_MS) / 1000,
            queue_max=int(settings.LLMGW_ADMISSION_QUEUE_MAX),
            margin=float(settings.LLMGW_ADMISSION_BATCH_MARGIN) / 100,
        )

    def _model(self, model: str) -> _Model | None:
        m = self._models.get(model)
        if m is None and len(self._models) < 10000:
            m = self._models[model] = _Model()
        return m

    # Figures.
    def record(self, model: str, ttft: float) -> None:
        """An admitted request of ``model`` had its first token after ``ttft`` seconds."""
        m = self._model(model)
        if m is None:
            return
        now = self._clock()
        second = int(now)
        hist = m.seconds.get(second)
        if hist is None:
            hist = m.seconds[second] = [0] * (len(EDGES_MS) + 1)
            self._trim(m, second)
        hist[bucket(ttft * 1000)] += 1
        m.recent.append((now, ttft * 1000))
        m.mine.append((now, ttft * 1000))
        m.live.append((now, ttft * 1000))
        if not m.batch and m.batch_since < now - ttft:
            # No batch line in flight here while it waited for its first token.
            m.clean_sample(int(now // 60), ttft * 1000)
        self._wake(m)

    def _wake(self, m: _Model) -> None:
        if m.opened is not None and not m.gate.open and m.waiting:
            m.opened.set()  # a sample or a request ended may make room: waiters look again

    def _trim(self, m: _Model, second: int) -> None:
        first = second - int(self.window) + 1
        for s in [s for s in m.seconds if s < first]:
            del m.seconds[s]

    def p99(self, model: str, now: float | None = None) -> float | None:
        """The model's TTFT p99 (ms) over the last window; None with no sample."""
        m = self._models.get(model)
        if m is None:
            return None
        now = self._clock() if now is None else now
        first = int(now) - int(self.window) + 1
        total = [0] * (len(EDGES_MS) + 1)
        for s, hist in m.seconds.items():
            if s >= first:
                for i, c in enumerate(hist):
                    if c:
                        total[i] += c
        return quantile(total, 0.99)

    def reading(self, model: str, slo_ms: float, now: float | None = None) -> Reading:
        """What this process knows of ``model`` now."""
        now = self._clock() if now is None else now
        m = self._models.get(model)
        if m is None:
            return Reading(None, (), slo_ms, idle=float("inf"))
        recent = tuple(ms for at, ms in m.recent if now - at < self.window)
        # Idle: nothing in flight here, nor a lower band's in another process.
        idle = 0.0 if m.busy or m.others else now - m.idle_since
        live_idle = 0.0 if m.busy > m.batch or m.others else now - m.live_since
        live = sorted(ms for at, ms in m.live if now - at < self.window)
        return Reading(self.p99(model, now), recent, slo_ms, m.lower + m.others, idle,
                       m.batch, now - m.batch_since, m.base(int(now // 60)),
                       live[len(live) // 2] if len(live) >= RECENT else None,
                       self.margin, live_idle)  # fmt: skip

    def limit(self, model: str) -> int | None:
        m = self._models.get(model)
        return m.gate.limit if m else None

    def heard(self, done: Done) -> None:
        """A request ended (``Gateway.done``, in its own task): it leaves the in-flight
        count, and an answered one's TTFT, less what it waited at the door, joins the
        window (not a batch's line: its own wait is no client's)."""
        waited = held_for.get()
        if waited:
            held_for.set(0.0)
        took = taken.get()
        if took is not None:
            taken.set(None)
            self.release(*took)
        if done.status != 200 or done.ttft is None or not done.model or done.batch:
            return  # a batch's lines (gateway.batch) are not what the slo holds
        self.record(done.model, max(0.0, done.ttft - waited))

    def release(self, model: str, low: bool, batch: bool = False) -> None:
        """An admitted request of ``model`` ended (``low``: of a live lower band, the count
        in Redis following with the next pass of ``gateway.shared``; ``batch``: a batch's
        line)."""
        m = self._models.get(model)
        if m is None:
            return
        m.busy = max(0, m.busy - 1)
        if not m.busy:
            m.idle_since = self._clock()
        if batch:
            m.batch = max(0, m.batch - 1)
            m.batch_since = self._clock()
            self._wake(m)
        elif m.busy <= m.batch:
            m.live_since = self._clock()  # the last live one: only batch lines left
        if low:
            m.lower = max(0, m.lower - 1)
            self._wake(m)

    # The decision.
    def _ahead(self, m: _Model, band: str) -> int:
        """Requests of higher lower bands waiting, in every process."""
        rank = RANK.get(band, RANK[DEFAULT_BAND])
        return sum(
            n
            for waiting in (m.waiting, m.others_waiting)
            for b, n in waiting.items()
            if 0 < RANK.get(b, RANK[DEFAULT_BAND]) < rank
        )

    @staticmethod
    def _queued(m: _Model, band: str) -> int:
        """Requests waiting for ``model`` in every process that count against the queue's
        bound for ``band``: a batch line is bounded by every waiting request, a live one
        by the live ones only (batch lines waiting never take a live request's place)."""
        return sum(
            n
            for waiting in (m.waiting, m.others_waiting)
            for b, n in waiting.items()
            if band == BATCH or b != BATCH
        )

    def check(self, model: str, band: str, slo_ms: float) -> Decision:
        """Whether a request of ``band`` goes in now (steps the model's gate; one that
        waits is taken out of the waiting while it asks, not ahead of itself)."""
        if not slo_ms:
            return Decision(True, None, None, 0.0)
        now = self._clock()
        m = self._model(model)
        if m is None:
            return Decision(True, None, None, slo_ms)
        r = self.reading(model, slo_ms, now)
        waits = m.waiting or m.others_waiting
        ahead = self._ahead(m, band) if waits and lower(band) else 0
        before = m.gate
        m.gate, decision = decide(m.gate, band, r, now, self.window, ahead)
        if self.shared is not None and m.gate[:3] != before[:3]:
            self.shared.gate_changed(model, before, m.gate)
        return decision

    async def _room(self, model: str, band: str, slo_ms: float) -> Decision:
        """``check``, and for a lower band let in by a closed gate, its room taken in Redis
        across the processes (``Shared.take``: one bounded script); Redis away: this
        process's decision."""
        decision = self.check(model, band, slo_ms)
        shared = self.shared
        if not decision.admit or decision.limit is None or shared is None \
                or not live_lower(band):  # fmt: skip
            return decision
        m = self._models.get(model)
        if m is None:
            return decision
        ahead = self._ahead(m, band) if m.waiting or m.others_waiting else 0
        total = await shared.take(model, decision.limit, ahead)
        if total is None:
            return decision  # Redis away: this process alone
        # Every process's in flight as Redis has it (this one's as of its last pass, and
        # its takes since): the others' part of it, roughly, until the next pass.
        if total < 0:
            m.others = max(m.others, -total - 1 - m.lower)
            return decision._replace(admit=False)
        return decision

    def adopt(self, model: str, limit: int | None, pressed: float, stepped: float) -> None:
        """Another gateway process changed ``model``'s gate (``gateway.shared``; times on
        this process's clock): this process's is the same from now on."""
        m = self._model(model)
        if m is None:
            return
        if limit is None:
            # Open elsewhere: the live bands here too; the batch's allowance stays this
            # process's own, stepped on what it hears.
            if m.gate.limit is not None:
                m.gate = Gate(None, pressed, stepped, 0)
        else:
            m.gate = Gate(limit, pressed, stepped, 0)
        self._wake(m)

    def others(self, model: str, lower_: int, waiting: dict[str, int]) -> None:
        """What the other gateway processes have of ``model``: their lower bands in flight
        and waiting, by band (``gateway.shared``, each quarter second)."""
        m = self._models.get(model)
        if m is None:
            return
        if (m.others, m.others_waiting) != (lower_, waiting):
            m.others, m.others_waiting = lower_, waiting
            self._wake(m)

    def recent(self, model: str) -> list[tuple[float, float]]:
        """The model's last first-token times measured here: (when, on this clock; ms)."""
        m = self._models.get(model)
        return list(m.mine) if m is not None else []

    def heard_elsewhere(self, model: str, samples: list[tuple[float, float]]) -> None:
        """First-token times another gateway process measured of ``model`` (when, on this
        clock; ms): the last ``RECENT`` of all are what the allowance steps on, so a slow
        one seen by a process that admits little does not keep cutting the allowance the
        others' fast ones would grow (``gateway.shared``, each quarter second)."""
        m = self._models.get(model)
        if m is None or not samples:
            return
        m.recent = deque(sorted([*m.recent, *samples])[-RECENT:], maxlen=RECENT)
        self._wake(m)

    def shared_counts(self) -> dict[str, tuple[int, dict[str, int]]]:
        """Per model with a closed gate or lower requests in flight (here or in another
        process): this process's lower bands in flight and its waiting by band
        (``gateway.shared``)."""
        return {
            name: (m.lower, {b: n for b, n in m.waiting.items() if n})
            for name, m in self._models.items()
            if m.gate.limit is not None or m.lower or m.others
        }

    def gates(self) -> dict[str, Gate]:
        """Each model's gate in this process (``gateway.shared``)."""
        return {name: m.gate for name, m in self._models.items()}

    def _take(self, model: str, band: str) -> None:
        m = self._models.get(model)
        if m is None:
            return
        low, batch = live_lower(band), band == BATCH
        m.busy += 1
        m.lower += low
        m.batch += batch
        taken.set((model, low, batch))

    async def admit(self, model: str, band: str, slo_ms: float) -> Decision:
        """Decide; a held request waits up to ``queue`` for room. Returns the last
        decision (``admit`` False: refuse it). Counted either way; an admitted one is
        in flight until ``heard`` of its end."""
        decision = await self._room(model, band, slo_ms)
        if not decision.admit and self.queue > 0:
            decision = await self._wait(model, band, slo_ms)
        if self.counts is not None:
            self.counts.add(int(self._wall()), model, band, not decision.admit)
        if not decision.admit:
            was_held.set(True)
        elif slo_ms:
            self._take(model, band)
        return decision

    async def _wait(self, model: str, band: str, slo_ms: float) -> Decision:
        m = self._models[model]
        if self._queued(m, band) >= self.queue_max:
            return await self._room(model, band, slo_ms)
        if m.opened is None:
            m.opened = asyncio.Event()
        # The wait is timed by the loop (the gate's clock may be a test's).
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.queue
        m.waiting[band] = m.waiting.get(band, 0) + 1
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                m.opened.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(m.opened.wait(), min(left, RECHECK))
                m.waiting[band] -= 1  # not ahead of itself
                try:
                    decision = await self._room(model, band, slo_ms)
                finally:
                    m.waiting[band] += 1
                if decision.admit:
                    held_for.set(loop.time() - start)
                    return decision
        finally:
            m.waiting[band] -= 1
        decision = await self._room(model, band, slo_ms)
        if decision.admit:
            held_for.set(loop.time() - start)
        return decision

    def state(self) -> dict[str, dict[str, object]]:
        """Each model's gate as this process sees it (the console, tests)."""
        now = self._clock()
        return {
            name: {"limit": m.gate.limit, "p99_ms": self.p99(name, now), "lower": m.lower,
                   "busy": m.busy, "waiting": sum(m.waiting.values()), "others": m.others,
                   "batch": m.batch, "batch_limit": m.gate.allowance(BATCH),
                   "batch_base_ms": m.base(int(now // 60))}
            for name, m in self._models.items()
        }  # fmt: skip


def retry_after(window: float, band: str = DEFAULT_BAND) -> int:
    """Seconds a refused request is told to wait: the window; a batch's line a second
    (the runner's own, it asks again at once when the live bands leave room)."""
    return 1 if band == BATCH else max(1, round(window))


class Listener(_Listener):
    """Feeds ``admission`` the first-token time of each answered request, less the time
    it waited at the door (``held_for``, set in the request's own task), and its end."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def request(self, done: Done) -> None:
        self.admission.heard(done)
