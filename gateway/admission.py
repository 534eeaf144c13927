"""Admission by priority band: while a model's recent TTFT p99 is past its ``slo``, the
lower bands wait at the door, briefly, then get 429 (issue 20, item 3).

A client key has a band (``high``, ``normal``, ``low``; ``ClientKey.priority``). Each
gateway process keeps, per model, the first-token times of the requests it admitted over
the last ``window`` seconds (a histogram per second on ``gateway.traffic``'s edges; the
time a request waited here is taken off, so a hold does not feed itself) and decides
from them alone: no database, no Redis, a few dictionary look-ups (``bench/autoscale.py``
prints the decision's p50).

The gate of a model has three levels, changed only by ``Gate.step`` (pure):

- 0, open: p99 within the slo (or no slo, or nothing seen in the window): every band in;
- 1: p99 past the slo: ``low`` is held;
- 2: still past it a whole window after level 1 began: ``normal`` is held too.

``high`` (the top band) is always admitted. When the window's p99 is back within the
slo (a window after the load fell, at most, as the slow samples age out of it) the gate
opens at once, every band together.

A held request waits up to ``queue`` seconds for its gate to open (at most ``queue_max``
waiting a model in this process; past it, refused at once), then is refused: 429 with
``Retry-After`` (the window), ``x-should-retry: true`` and a message naming the band, the
p99 and the slo. Admitted and held requests are counted per model, band and second
(``Counts``) and ride the traffic event to the console's Traffic page.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.observe import Done
from gateway.observe import Listener as _Listener

BANDS = ("high", "normal", "low")  # top first
DEFAULT_BAND = "normal"
RANK = {b: i for i, b in enumerate(BANDS)}
# Histogram edges in ms (gateway.traffic's, so both read the same percentiles).
EDGES_MS = (5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1000, 1500, 2000, 3000,
            5000, 10000, 30000, 60000)  # fmt: skip
WINDOW = 10.0
QUEUE = 2.0
QUEUE_MAX = 100
# How often a held request looks at its gate again when no sample arrives to wake it.
RECHECK = 0.1

# Whether the running request was held and refused (the traffic history counts it).
was_held: contextvars.ContextVar[bool] = contextvars.ContextVar("admission_was_held",
                                                                default=False)  # fmt: skip
# Seconds the running request waited at the door (taken off its TTFT when it ends).
held_for: contextvars.ContextVar[float] = contextvars.ContextVar("admission_held_for",
                                                                 default=0.0)  # fmt: skip


def bucket(ms: float) -> int:
    return bisect_left(EDGES_MS, ms)


def quantile(counts: list[int], q: float) -> float | None:
    """The upper edge (ms) of the bucket holding quantile ``q``; None with no sample;
    ``inf`` past the last edge (never optimistic)."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= rank and c:
            return float(EDGES_MS[i]) if i < len(EDGES_MS) else float("inf")
    return float("inf")


@dataclass(frozen=True)
class Gate:
    """A model's gate: its level (0 open, 1 low held, 2 normal and low held) and since
    when (a monotonic time)."""

    level: int = 0
    since: float = 0.0

    def step(self, p99_ms: float | None, slo_ms: float, now: float, window: float) -> Gate:
        """The gate after seeing ``p99_ms`` over the last window at ``now``."""
        over = bool(slo_ms) and p99_ms is not None and p99_ms > slo_ms
        if not over:
            return self if self.level == 0 else Gate(0, now)
        if self.level == 0:
            return Gate(1, now)
        if self.level == 1 and now - self.since >= window:
            return Gate(2, now)
        return self

    def holds(self, band: str) -> bool:
        """Whether ``band`` waits at this gate (the top band never does)."""
        rank = RANK.get(band, RANK[DEFAULT_BAND])
        return rank > 0 and rank >= len(BANDS) - self.level


@dataclass(frozen=True)
class Decision:
    admit: bool
    level: int
    p99_ms: float | None
    slo_ms: float


def decide(gate: Gate, band: str, p99_ms: float | None, slo_ms: float, now: float,
           window: float) -> tuple[Gate, Decision]:  # fmt: skip
    """Step ``gate`` with the window's p99 and say whether ``band`` goes in (pure)."""
    gate = gate.step(p99_ms, slo_ms, now, window)
    return gate, Decision(not gate.holds(band), gate.level, p99_ms, slo_ms)


def reason(band: str, model: str, decision: Decision, window: float) -> str:
    """What a refused client is told: the band, the p99 and the slo."""
    p99 = "over 60000" if decision.p99_ms == float("inf") else f"{decision.p99_ms:.0f}"
    return (
        f"The model '{model}' is past its latency SLO (TTFT p99 {p99} ms over the last "
        f"{window:g} s, slo {decision.slo_ms:.0f} ms), so requests of the {band!r} band are "
        f"held back for the higher bands: try again in {max(1, round(window))} s, or use a "
        "key of a higher band."
    )


@dataclass
class _Model:
    gate: Gate = field(default_factory=Gate)
    # second -> TTFT histogram of that second
    seconds: dict[int, list[int]] = field(default_factory=dict)
    waiting: int = 0
    opened: asyncio.Event | None = None


class Counts:
    """Admitted and held requests per (second, model, band), taken once a second by the
    traffic publisher (``gateway.traffic``)."""

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
    """One process's admission: the recent TTFTs per model and their gates."""

    def __init__(
        self,
        window: float = WINDOW,
        queue: float = QUEUE,
        queue_max: int = QUEUE_MAX,
        clock: Callable[[], float] = time.monotonic,
        counts: Counts | None = COUNTS,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.window = window
        self.queue = queue
        self.queue_max = queue_max
        self._clock = clock
        self._wall = wall
        self.counts = counts
        self._models: dict[str, _Model] = {}

    @classmethod
    def from_settings(cls) -> Admission:
        from django.conf import settings

        return cls(
            window=float(getattr(settings, "LLMGW_ADMISSION_WINDOW", WINDOW)),
            queue=float(getattr(settings, "LLMGW_ADMISSION_QUEUE_MS", QUEUE * 1000)) / 1000,
            queue_max=int(getattr(settings, "LLMGW_ADMISSION_QUEUE_MAX", QUEUE_MAX)),
        )

    # Figures.
    def record(self, model: str, ttft: float) -> None:
        """An admitted request of ``model`` had its first token after ``ttft`` seconds."""
        m = self._models.get(model)
        if m is None:
            if len(self._models) >= 10000:
                return
            m = self._models[model] = _Model()
        second = int(self._clock())
        hist = m.seconds.get(second)
        if hist is None:
            hist = m.seconds[second] = [0] * (len(EDGES_MS) + 1)
            self._trim(m, second)
        hist[bucket(ttft * 1000)] += 1
        if m.opened is not None and m.gate.level and m.waiting:
            # A sample may open the gate: its waiters look again.
            m.opened.set()

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

    def level(self, model: str) -> int:
        m = self._models.get(model)
        return m.gate.level if m else 0

    def heard(self, done: Done) -> None:
        """A request ended (``Gateway.done``, in its own task): an answered one's TTFT,
        less what it waited at the door, joins the window."""
        waited = held_for.get()
        if waited:
            held_for.set(0.0)
        if done.status != 200 or done.ttft is None or not done.model:
            return
        self.record(done.model, max(0.0, done.ttft - waited))

    # The decision.
    def check(self, model: str, band: str, slo_ms: float) -> Decision:
        """Whether a request of ``band`` goes in now (steps the model's gate)."""
        if not slo_ms:
            return Decision(True, 0, None, 0.0)
        now = self._clock()
        m = self._models.get(model)
        if m is None:
            if len(self._models) >= 10000:
                return Decision(True, 0, None, slo_ms)
            m = self._models[model] = _Model()
        m.gate, decision = decide(m.gate, band, self.p99(model, now), slo_ms, now, self.window)
        return decision

    async def admit(self, model: str, band: str, slo_ms: float) -> Decision:
        """Decide; a held request waits up to ``queue`` for the gate to open. Returns the
        last decision (``admit`` False: refuse it). Counted either way."""
        decision = self.check(model, band, slo_ms)
        if not decision.admit and self.queue > 0:
            decision = await self._wait(model, band, slo_ms)
        if self.counts is not None:
            self.counts.add(int(self._wall()), model, band, not decision.admit)
        if not decision.admit:
            was_held.set(True)
        return decision

    async def _wait(self, model: str, band: str, slo_ms: float) -> Decision:
        m = self._models[model]
        if m.waiting >= self.queue_max:
            return self.check(model, band, slo_ms)
        if m.opened is None:
            m.opened = asyncio.Event()
        # The wait is timed by the loop (the gate's clock may be a test's).
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.queue
        m.waiting += 1
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    return self.check(model, band, slo_ms)
                m.opened.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(m.opened.wait(), min(left, RECHECK))
                decision = self.check(model, band, slo_ms)
                if decision.admit:
                    held_for.set(loop.time() - start)
                    return decision
        finally:
            m.waiting -= 1

    def state(self) -> dict[str, dict[str, object]]:
        """Each model's gate as this process sees it (the console, tests)."""
        now = self._clock()
        return {
            name: {"level": m.gate.level, "held": [b for b in BANDS if m.gate.holds(b)],
                   "p99_ms": self.p99(name, now), "waiting": m.waiting}
            for name, m in self._models.items()
        }  # fmt: skip


def retry_after(window: float) -> int:
    return max(1, round(window))


class Listener(_Listener):
    """Feeds ``admission`` the first-token time of each answered request, less the time
    it waited at the door (``held_for``, set in the request's own task)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission

    def request(self, done: Done) -> None:
        self.admission.heard(done)
