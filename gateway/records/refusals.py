"""The guard's refusals on the gateway, kept by request id (``gateway.models.Refusal``).

A client told "refused" holds the answer's ``x-request-id``; an operator looks that id up
in the console (``/gateway/refusals/``), the API (``/api/v1/gateway/refusals/``) or the
admin. ``RefusalRecorder`` is an observer (``gateway.records.observe``): the Gateway tells it each
refusal (``Observer.refusal``, the record the client's answer was built from: the judge,
its verdict, categories and score, never the text), and it appends the record to a list
in memory under a lock. A background thread writes what gathered every ``interval``
seconds (``LLMGW_GATEWAY_USAGE_FLUSH_MS``, as the usage) in one transaction; a flush
that fails puts its records back, ahead of what gathered meanwhile; ``stop`` (and the
process's exit) writes what is left. At most ``MAX_PENDING`` records wait: past it (a
database away for long) new ones are dropped, counted and logged.

A row is written once: the request id is unique and a batch written again (its commit
was not heard) skips the rows already there. Rows older than
``LLMGW_GATEWAY_REFUSAL_DAYS`` are deleted by ``prune`` (``gateway.tasks``).
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import threading
import time
from collections.abc import Callable

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from gateway.models import Refusal
from gateway.records import observe
from gateway.records.observe import Listener
from llmgw_core.batches import Batcher

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0
# Records waiting at most between two flushes; a few hundred bytes each.
MAX_PENDING = 20_000
# Rows written per INSERT, and deleted per DELETE by the retention job.
CHUNK = 1000
PRUNE_CHUNK = 10_000
# The most categories kept of one refusal, and each one's length.
MAX_CATEGORIES = 50
CATEGORY_CHARS = 100

Pending = tuple[float, observe.RefusalHeard]  # (Unix time it was heard, the record)


def row(at: float, record: observe.RefusalHeard) -> Refusal:
    """Return the model row of a record heard at ``at`` (Unix seconds).

    Every value is cut to its column's size and rid of NUL characters (which PostgreSQL
    cannot store), so no record can fail a batch: a failed batch is put back and would
    fail again, holding every later one.
    """
    score = record.score
    if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
        score = None
    direction = record.direction if record.direction in Refusal.Direction.values else "request"
    categories = [_text(c, CATEGORY_CHARS) for c in record.categories[:MAX_CATEGORIES]]
    failures = [
        {"judge": _text(judge, 200), "kind": _text(kind, 40)}
        for judge, kind in record.failures[:MAX_CATEGORIES]
    ]
    return Refusal(
        at=dt.datetime.fromtimestamp(at, tz=dt.UTC), request_id=_text(record.request_id, 40),
        direction=direction, model=_text(record.model, 200), key=_text(record.key, 100),
        owner=_text(record.owner, 120), judge=_text(record.judge, 200),
        verdict=_text(record.verdict, 40), categories=categories, score=score,
        judged=bool(record.judged), failures=failures,
    )  # fmt: skip


def _text(value: object, chars: int) -> str:
    return str(value).replace("\x00", "")[:chars]


def write(batch: list[Pending]) -> None:
    """Write a batch of records in one transaction; one already written is skipped."""
    if not batch:
        return
    with transaction.atomic():
        Refusal.objects.bulk_create(
            [row(at, record) for at, record in batch], batch_size=CHUNK, ignore_conflicts=True
        )


class RefusalRecorder(Batcher, Listener):
    """Gathers the guard's refusals in memory; a background thread writes them in
    batches (``llmgw_core.batches``).

    ``writer`` writes a batch (``write``; a test may pass one that fails); ``clock``
    gives the Unix time a refusal was heard at.
    """

    thread_name = "gateway-refusals"
    what = "the gateway's refusal records"

    def __init__(
        self,
        interval: float = FLUSH_INTERVAL,
        writer: Callable[[list[Pending]], None] = write,
        clock: Callable[[], float] = time.time,
        max_pending: int = MAX_PENDING,
    ) -> None:
        super().__init__()
        self._init_batches(interval)
        self._writer = writer
        self._clock = clock
        self.max_pending = max_pending
        self._lock = threading.Lock()  # guards _pending and dropped
        self._pending: list[Pending] = []
        self.dropped = 0

    # The request path: the refusal's record, and nothing else of the traffic.
    def refusal(self, record: observe.RefusalHeard) -> None:
        at = self._clock()
        with self._lock:
            if len(self._pending) >= self.max_pending:
                self.dropped += 1
                return
            self._pending.append((at, record))

    def pending(self) -> list[Pending]:
        """A copy of what waits to be written, oldest first."""
        with self._lock:
            return list(self._pending)

    def _take(self) -> list[Pending] | None:
        with self._lock:
            batch, self._pending = self._pending, []
            dropped, self.dropped = self.dropped, 0
        if dropped:
            log.warning("the gateway dropped %d refusal records (the database was away)", dropped)
        return batch or None

    def _write(self, batch: list[Pending]) -> None:
        self._writer(batch)

    def _put_back(self, batch: list[Pending]) -> None:
        # Ahead of what gathered meanwhile, within the bound: the newest are dropped, as
        # they would have been had the batch stayed.
        with self._lock:
            merged = batch + self._pending
            self.dropped += max(0, len(merged) - self.max_pending)
            self._pending = merged[: self.max_pending]


RECORDER = RefusalRecorder()


def start() -> None:
    """Write refusal records in the background from now on (the servers call it), every
    ``LLMGW_GATEWAY_USAGE_FLUSH_MS``."""
    RECORDER.interval = max(1, settings.LLMGW_GATEWAY_USAGE_FLUSH_MS) / 1000.0
    RECORDER.start()


def prune(days: int | None = None, now: dt.datetime | None = None) -> int:
    """Delete refusal records older than ``days`` (``LLMGW_GATEWAY_REFUSAL_DAYS``); return
    how many went.

    In chunks of ``PRUNE_CHUNK`` rows, each its own statement, so a large backlog never
    holds the table in one long transaction.
    """
    days = settings.LLMGW_GATEWAY_REFUSAL_DAYS if days is None else days
    cutoff = (now or timezone.now()) - dt.timedelta(days=days)
    deleted = 0
    while True:
        ids = list(
            Refusal.objects.filter(at__lt=cutoff)
            .order_by("at")
            .values_list("pk", flat=True)[:PRUNE_CHUNK]
        )
        if not ids:
            break
        deleted += Refusal.objects.filter(pk__in=ids).delete()[0]
        if len(ids) < PRUNE_CHUNK:
            break
    if deleted:
        log.info("deleted %d refusal records older than %d days", deleted, days)
    return deleted
