"""Traffic over time: what the gateway counts per model, kept in the
database and downsampled; per key and per owner from the usage records.

``HistoryRecorder`` is an observer (``gateway.records.observe``) like ``gateway.records.usage``'s: each
request ended is added, under a lock, to its minute's bucket per model (requests,
errors, guard refusals, admission holds and overflows, tokens in and out, the seconds requests were in
flight, and a TTFT histogram on ``gateway.records.traffic``'s edges); a background thread writes
what gathered every second in one transaction (``write``: each (minute, model) row read
for update and added to, so any number of processes stay exact). Nothing on the request
path touches the database.

``roll`` (the periodic job ``roll-gateway-history``, ``gateway.tasks.roll_history``)
keeps minutes for ``LLMGW_HISTORY_MINUTE_HOURS`` (24) and hours for
``LLMGW_HISTORY_HOUR_DAYS`` (30): older minutes are summed into their hour (histograms
added, so the hour's percentiles are exact to the bucket), older hours deleted.
Prometheus stays the way to keep more.

``series`` reads a model's points over the last hour, day or week (a point a minute, ten
minutes or an hour), ``usage_series`` a key's or an owner's requests and tokens from
``gateway.models.Usage``; ``chart`` lays a series out as an SVG path (pure), with marks
(scale events, bench runs, admission holds) at their times.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from cluster.models import ClusterAction, Replica
from gateway.cacheshare import share
from gateway.models import TrafficPoint, Usage
from gateway.path import admission
from gateway.path.admission import EDGES_MS, quantile
from gateway.records.observe import Done, Listener
from llmgw_core.batches import Batcher

log = logging.getLogger(__name__)

SPANS = {"hour": (3600, 60), "day": (86400, 600), "week": (7 * 86400, 3600)}  # span, step
MAX_PENDING = 20_000
NBUCKETS = len(EDGES_MS) + 1
COUNTS = (
    "requests",
    "errors",
    "refusals",
    "held",
    "overflowed",
    "tokens_in",
    "tokens_out",
    "busy_ms",
    "batch_requests",
)

# A refusal by the guard, or a hold at admission, heard in the request's own task.
_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("history_refused", default=False)


@dataclass
class Counts:
    requests: int = 0
    errors: int = 0
    refusals: int = 0
    held: int = 0
    # Held back by admission and sent to the model's overflow (counted at the model asked
    # for; the request itself is the overflow model's).
    overflowed: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    busy_ms: int = 0  # request-milliseconds in flight: / the period = the mean in flight
    ttft: list[int] = field(default_factory=lambda: [0] * NBUCKETS)
    # Of tokens_in, cached by the engine: read from the usage rows (a key's, an owner's).
    tokens_cached: int = 0
    batch_requests: int = 0  # of requests, those a batch's runner sent (gateway.batch)

    def add(self, other: Counts) -> None:
        for f in COUNTS:
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.tokens_cached += other.tokens_cached
        self.ttft = [a + b for a, b in zip(self.ttft, other.ttft, strict=True)]


Bucket = tuple[int, str]  # (minute as Unix seconds, model)


def write(batch: dict[Bucket, Counts]) -> None:
    """Add a batch to the minute rows in one transaction, rows in order (no deadlock)."""
    if not batch:
        return
    with transaction.atomic():
        for minute, model in sorted(batch):
            c = batch[(minute, model)]
            at = dt.datetime.fromtimestamp(minute, tz=dt.UTC)
            TrafficPoint.objects.get_or_create(resolution=TrafficPoint.MINUTE, at=at, model=model)
            row = TrafficPoint.objects.select_for_update().get(
                resolution=TrafficPoint.MINUTE, at=at, model=model
            )
            _add(row, c)
            row.save()


def _add(row: Any, c: Counts) -> None:
    for f in COUNTS:
        setattr(row, f, getattr(row, f) + getattr(c, f))
    old = row.ttft if isinstance(row.ttft, list) and len(row.ttft) == NBUCKETS else [0] * NBUCKETS
    row.ttft = [a + b for a, b in zip(old, c.ttft, strict=True)]


class HistoryRecorder(Batcher, Listener):
    """Gathers each model's minute in memory; a background thread writes it."""

    thread_name = "gateway-history"
    what = "the gateway's traffic history"

    def __init__(
        self,
        interval: float = 1.0,
        writer: Callable[[dict[Bucket, Counts]], None] = write,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__()
        self._init_batches(interval)
        self._writer = writer
        self._clock = clock
        self._lock = threading.Lock()
        self._pending: dict[Bucket, Counts] = {}
        self.dropped = 0

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        _refused.set(True)

    def overflowed(self, model: str, to: str) -> None:
        bucket = (int(self._clock()) // 60 * 60, model)
        with self._lock:
            c = self._pending.get(bucket)
            if c is None:
                if len(self._pending) >= MAX_PENDING:
                    self.dropped += 1
                    return
                c = self._pending[bucket] = Counts()
            c.overflowed += 1

    def request(self, done: Done) -> None:
        refused = _refused.get()
        if refused:
            _refused.set(False)
        held = admission.was_held.get()
        if held:
            admission.was_held.set(False)
        if not done.model:
            return
        bucket = (int(self._clock()) // 60 * 60, done.model)
        with self._lock:
            c = self._pending.get(bucket)
            if c is None:
                if len(self._pending) >= MAX_PENDING:
                    self.dropped += 1
                    return
                c = self._pending[bucket] = Counts()
            c.requests += 1
            if done.batch:
                c.batch_requests += 1
            if refused:
                c.refusals += 1
            elif held:
                c.held += 1
            elif done.status >= 400 and done.status != 499:
                c.errors += 1
            c.tokens_in += done.tokens_in
            c.tokens_out += done.tokens_out
            c.busy_ms += int(done.seconds * 1000)
            if done.status == 200 and done.ttft is not None:
                c.ttft[admission.bucket(done.ttft * 1000)] += 1

    def pending(self) -> dict[Bucket, Counts]:
        with self._lock:
            return {
                b: Counts(**{**vars(c), "ttft": list(c.ttft)}) for b, c in self._pending.items()
            }

    def _take(self) -> dict[Bucket, Counts] | None:
        with self._lock:
            batch, self._pending = self._pending, {}
            dropped, self.dropped = self.dropped, 0
        if dropped:
            log.warning("the traffic history dropped %d requests (the database was away)", dropped)
        return batch or None

    def _write(self, batch: dict[Bucket, Counts]) -> None:
        self._writer(batch)

    def _put_back(self, batch: dict[Bucket, Counts]) -> None:
        with self._lock:
            for bucket, c in self._pending.items():
                batch.setdefault(bucket, Counts()).add(c)
            self._pending = batch


RECORDER = HistoryRecorder()


def start() -> None:
    """Write the history in the background from now on (the servers call it)."""
    RECORDER.interval = max(1, settings.LLMGW_GATEWAY_USAGE_FLUSH_MS) / 1000.0
    RECORDER.start()


def roll(now: dt.datetime | None = None) -> tuple[int, int]:
    """Sum minutes older than the minutes' keep into their hours; delete hours older than
    the hours' keep. Return (minutes rolled, hours deleted)."""
    now = now or dt.datetime.now(dt.UTC)
    cut = (now - dt.timedelta(hours=settings.LLMGW_HISTORY_MINUTE_HOURS)).replace(
        minute=0, second=0, microsecond=0
    )
    old = TrafficPoint.objects.filter(resolution=TrafficPoint.MINUTE, at__lt=cut)
    hours: dict[tuple[dt.datetime, str], Counts] = {}
    rolled = 0
    with transaction.atomic():
        rows = list(old.select_for_update().order_by("at", "model"))
        for r in rows:
            c = hours.setdefault((r.at.replace(minute=0), r.model), Counts())
            c.add(_counts(r))
            rolled += 1
        for (at, model), c in sorted(hours.items()):
            TrafficPoint.objects.get_or_create(resolution=TrafficPoint.HOUR, at=at, model=model)
            row = TrafficPoint.objects.select_for_update().get(
                resolution=TrafficPoint.HOUR, at=at, model=model
            )
            _add(row, c)
            row.save()
        TrafficPoint.objects.filter(pk__in=[r.pk for r in rows]).delete()
    gone, _ = TrafficPoint.objects.filter(
        resolution=TrafficPoint.HOUR,
        at__lt=now - dt.timedelta(days=settings.LLMGW_HISTORY_HOUR_DAYS),
    ).delete()
    return rolled, gone


def _counts(row: Any) -> Counts:
    c = Counts(**{f: getattr(row, f) for f in COUNTS})
    if isinstance(row.ttft, list) and len(row.ttft) == NBUCKETS:
        c.ttft = list(row.ttft)
    return c


# Reading.


@dataclass(frozen=True)
class Point:
    at: dt.datetime
    requests: int
    errors: int
    refusals: int
    held: int
    tokens_in: int
    tokens_out: int
    in_flight: float  # the mean requests in flight over the point
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tokens_cached: int = 0  # of tokens_in (a key's and an owner's series)
    overflowed: int = 0  # held back by admission and sent to the model's overflow
    batch_requests: int = 0  # of requests, those a batch's runner sent (gateway.batch)

    @property
    def cached_share(self) -> int | None:
        """The cached share of the point's prompt tokens, in per cent (None: none)."""
        return share(self.tokens_in, self.tokens_cached)

    def as_dict(self) -> dict[str, Any]:
        return {"at": self.at.isoformat(), "requests": self.requests, "errors": self.errors,
                "refusals": self.refusals, "held": self.held, "overflowed": self.overflowed,
                "tokens_in": self.tokens_in,
                "tokens_out": self.tokens_out, "in_flight": round(self.in_flight, 3),
                "ttft_p50_ms": self.ttft_p50_ms, "ttft_p99_ms": self.ttft_p99_ms,
                "batch_requests": self.batch_requests}  # fmt: skip


def group(rows: Iterable[tuple[dt.datetime, Counts]], start: dt.datetime, span: int,
          step: int) -> list[Point]:  # fmt: skip
    """Rows (of any resolution) summed into points of ``step`` seconds from ``start``
    (pure); a step with no row is a point of zeros."""
    sums: dict[int, Counts] = {}
    t0 = int(start.timestamp())
    for at, c in rows:
        i = (int(at.timestamp()) - t0) // step
        if 0 <= i < span // step:
            sums.setdefault(i, Counts()).add(c)
    out = []
    for i in range(span // step):
        c = sums.get(i, Counts())
        out.append(Point(
            dt.datetime.fromtimestamp(t0 + i * step, tz=dt.UTC), c.requests, c.errors,
            c.refusals, c.held, c.tokens_in, c.tokens_out, c.busy_ms / 1000 / step,
            _q(c.ttft, 0.5), _q(c.ttft, 0.99), c.tokens_cached, c.overflowed,
            c.batch_requests,
        ))  # fmt: skip
    return out


def _q(hist: list[int], q: float) -> float | None:
    v = quantile(hist, q)
    return None if v is None or v == float("inf") else v


def window(span: str, now: dt.datetime | None = None) -> tuple[dt.datetime, int, int]:
    """The start, length and step of a span (``hour``, ``day``, ``week``) ending now."""
    length, step = SPANS[span]
    now = now or dt.datetime.now(dt.UTC)
    end = dt.datetime.fromtimestamp((int(now.timestamp()) // step + 1) * step, tz=dt.UTC)
    return end - dt.timedelta(seconds=length), length, step


def series(model: str, span: str, now: dt.datetime | None = None) -> list[Point]:
    """A model's points over the span, from minute and hour rows alike."""
    start, length, step = window(span, now)
    rows = TrafficPoint.objects.filter(model=model, at__gte=start).order_by("at")
    return group(((r.at, _counts(r)) for r in rows), start, length, step)


def usage_series(*, key: str = "", owner: str = "", span: str = "day",
                 now: dt.datetime | None = None) -> list[Point]:  # fmt: skip
    """A key's or an owner's requests and tokens over the span (``Usage``'s minutes)."""
    start, length, step = window(span, now)
    rows = Usage.objects.filter(minute__gte=start)
    rows = rows.filter(key=key) if key else rows.filter(owner=owner)
    return group(
        ((u.minute, Counts(requests=u.requests, errors=u.errors, refusals=u.refusals,
                           tokens_in=u.tokens_in, tokens_out=u.tokens_out,
                           tokens_cached=u.tokens_cached,
                           batch_requests=u.batch_requests)) for u in rows),
        start, length, step,
    )  # fmt: skip


def marks(model: str, start: dt.datetime) -> list[tuple[dt.datetime, str, str]]:
    """What happened to a model since ``start``: (when, kind, what): replicas made or
    given up (scale events), bench runs, and the points with admission holds are marked
    by ``chart`` itself."""
    out: list[tuple[dt.datetime, str, str]] = []
    for r in Replica.objects.filter(model_name=model, created__gte=start).only("pk", "created"):
        out.append((r.created, "replica", f"replica #{r.pk} made"))
    target = f"model {model}"
    # Its own actions only ("model pair", "model pair profile big"; not "model pair2").
    for a in ClusterAction.objects.filter(
        Q(action__startswith="bench") | Q(action__startswith="scaled "),
        Q(target=target) | Q(target__startswith=f"{target} profile "),
        at__gte=start,
    ).only("at", "action", "detail"):
        if a.action.startswith("scaled "):
            out.append((a.at, "scale", f"{a.action}: {a.detail}"))
        else:
            out.append((a.at, "bench", a.action))
    return sorted(out)


# The chart (pure).


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    path: str  # the line, SVG path data
    top: float  # the value at the top edge
    label: str
    marks: tuple[tuple[float, str, str], ...]  # (x, kind, title)
    holds: tuple[tuple[float, float, str], ...]  # (x, width, title): points with holds
    first: str
    last: str
    quiet: bool = False  # nothing to draw: no point with a value above zero


def chart(points: Sequence[Point], what: str, label: str,
          extra: Iterable[tuple[dt.datetime, str, str]] = (), width: int = 600,
          height: int = 80) -> Chart:  # fmt: skip
    """Lay out ``what`` of each point (None: no line there) as SVG path data."""
    values = [getattr(p, what) for p in points]
    top = max((v for v in values if v is not None), default=0) or 1
    n = max(1, len(points) - 1)
    parts: list[str] = []
    pen_up = True
    for i, v in enumerate(values):
        if v is None:
            pen_up = True
            continue
        x = round(i * width / n, 1)
        y = round(height - (v / top) * (height - 4) - 2, 1)
        parts.append(f"{'M' if pen_up else 'L'}{x},{y}")
        pen_up = False
    first = points[0].at if points else dt.datetime.now(dt.UTC)
    last = points[-1].at if points else first
    span = max(1.0, (last - first).total_seconds())
    cell = width / max(1, len(points))
    holds = tuple((round(i * width / n - cell / 2, 1), round(cell, 1), _held(p))
                  for i, p in enumerate(points) if p.held or p.overflowed)  # fmt: skip
    # The last point stands for its whole step (the minute going on, on the hour's chart):
    # what happened in it is marked at the right edge, not left out.
    end = last + (last - first) / n
    placed = tuple(
        (round(min(width, max(0.0, (at - first).total_seconds() / span * width)), 1), kind, title)
        for at, kind, title in extra if first <= at <= end
    )  # fmt: skip
    return Chart(width, height, " ".join(parts), top, label, placed, holds,
                 first.strftime("%m-%d %H:%M"), last.strftime("%m-%d %H:%M"),
                 quiet=not any(values))  # fmt: skip


def _held(p: Point) -> str:
    """What admission did at a point: held back (429), sent to the overflow instead."""
    parts = [f"{p.held} held"] if p.held else []
    if p.overflowed:
        parts.append(f"{p.overflowed} sent to its overflow")
    return ", ".join(parts)


def charts_for(
    *, model: str = "", key: str = "", owner: str = "", span: str = "day"
) -> list[Chart]:
    """The console's charts of a series: a model's requests and of them a batch's lines
    (``gateway.batch``), TTFT p99, mean in flight and tokens out (marked with its scale events, bench runs and admission holds); a key's or
    an owner's requests, tokens and the cached share of its tokens in."""
    if model:
        points = series(model, span)
        extra = marks(model, points[0].at) if points else []
        return [
            chart(points, "requests", "requests", extra),
            chart(points, "batch_requests", "of them, batch lines", extra),
            chart(points, "ttft_p99_ms", "TTFT p99 (ms)", extra),
            chart(points, "in_flight", "mean in flight", extra),
            chart(points, "tokens_out", "tokens out", extra),
        ]
    points = usage_series(key=key, owner=owner, span=span)
    return [chart(points, "requests", "requests"), chart(points, "tokens_out", "tokens out"),
            chart(points, "tokens_in", "tokens in"),
            chart(points, "cached_share", "cached share of tokens in (%)")]  # fmt: skip
