"""What the gateway served, written off the request path in batches (``gateway.models.Usage``).

``UsageRecorder`` is an observer (``gateway.records.observe``): the Gateway tells it each request
as it ended, and it adds the request to its minute's bucket (the minute, the key's name,
its owner, the model that answered) in memory, under a lock: a dictionary look-up and a
few additions. A background thread writes what has gathered every ``interval`` seconds
(``LLMGW_GATEWAY_USAGE_FLUSH_MS``, 1000) in one transaction: per bucket one upsert that adds
its counts in the database (``count = count + n``), so they stay exact with any number of
processes and flushes. A flush that fails puts its counts back to be written with the
next; ``stop`` (and the process's exit, through ``atexit``) writes what is left. The
servers start it (``gateway.server.run``, ``llmgw_admin.server.run``); importing the
application starts nothing.

A request's bucket counts it once in ``requests``; in ``errors`` when its answer was an
error (4xx or 5xx) other than a refusal; in ``refusals`` when the guard refused its
request or its answer (the refusal is heard in the request's own task, before it ends);
its tokens as the engine's usage said (``tokens_cached``: of ``tokens_in``, those the
engine read from its prefix cache); in ``batch_requests`` too when a batch's runner sent
it (``gateway.batch``: the row says how much of its traffic was batch work). A client that went away (499) counts as a request
and nothing else.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F

from gateway.models import Usage
from gateway.records.observe import Done, Listener
from llmgw_core.batches import Batcher

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0
# Buckets gathered at most between two flushes (a database away for long): past it new
# buckets are dropped, counted and logged, and memory stays bounded.
MAX_PENDING = 100_000

Bucket = tuple[int, str, str, str]  # (minute as Unix seconds, key, owner, model)
FIELDS = ("requests", "errors", "tokens_in", "tokens_out", "refusals", "tokens_cached",
          "batch_requests")  # fmt: skip

# Refusals heard in the running request's task, until its end is heard.
_refused: contextvars.ContextVar[bool] = contextvars.ContextVar("gateway_usage_refused",
                                                                default=False)  # fmt: skip


@dataclass
class Counts:
    requests: int = 0
    errors: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    refusals: int = 0
    tokens_cached: int = 0  # of tokens_in, read from the engine's prefix cache
    batch_requests: int = 0  # of requests, those a batch's runner sent (gateway.batch)

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.refusals += other.refusals
        self.tokens_cached += other.tokens_cached
        self.batch_requests += other.batch_requests


def write(batch: dict[Bucket, Counts]) -> None:
    """Add a batch's counts to the database in one transaction.

    Rows are touched in bucket order, so two processes flushing at once cannot deadlock.
    """
    if not batch:
        return
    buckets = sorted(batch)
    with transaction.atomic():
        Usage.objects.bulk_create(
            [Usage(minute=_minute(m), key=k, owner=o, model=n) for m, k, o, n in buckets],
            ignore_conflicts=True,
        )
        for bucket in buckets:
            m, k, o, n = bucket
            counts = batch[bucket]
            changes = {f: F(f) + getattr(counts, f) for f in FIELDS if getattr(counts, f)}
            if changes:
                Usage.objects.filter(minute=_minute(m), key=k, owner=o, model=n).update(**changes)


def _minute(seconds: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, tz=dt.UTC)


class UsageRecorder(Batcher, Listener):
    """Gathers requests' usage in memory; a background thread writes it in batches
    (``llmgw_core.batches``).

    ``writer`` writes a batch (``write``; a test may pass one that fails); ``clock``
    gives the Unix time a request ended at.
    """

    thread_name = "gateway-usage"
    what = "the gateway's usage"

    def __init__(
        self,
        interval: float = FLUSH_INTERVAL,
        writer: Callable[[dict[Bucket, Counts]], None] = write,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()

        self._init_batches(interval)
        self._writer = writer
        self._clock = clock or time.time
        self._lock = threading.Lock()  # guards _pending
        self._pending: dict[Bucket, Counts] = {}
        self.dropped = 0

    # The request path.
    def request(self, done: Done) -> None:
        refused = _refused.get()
        if refused:
            _refused.set(False)
        bucket = (int(self._clock()) // 60 * 60, done.key, done.owner, done.model)
        with self._lock:
            counts = self._pending.get(bucket)
            if counts is None:
                if len(self._pending) >= MAX_PENDING:
                    self.dropped += 1
                    return
                counts = self._pending[bucket] = Counts()
            counts.requests += 1
            if done.batch:
                counts.batch_requests += 1
            if refused:
                counts.refusals += 1
            elif done.status >= 400 and done.status != 499:
                counts.errors += 1
            counts.tokens_in += done.tokens_in
            counts.tokens_out += done.tokens_out
            counts.tokens_cached += done.tokens_cached

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        _refused.set(True)

    def pending(self) -> dict[Bucket, Counts]:
        """A copy of what waits to be written."""
        with self._lock:
            return {b: Counts(**vars(c)) for b, c in self._pending.items()}

    def _take(self) -> dict[Bucket, Counts] | None:
        with self._lock:
            batch, self._pending = self._pending, {}
            dropped, self.dropped = self.dropped, 0
        if dropped:
            log.warning("the gateway's usage dropped %d requests (the database was away)",
                        dropped)  # fmt: skip
        return batch or None

    def _write(self, batch: dict[Bucket, Counts]) -> None:
        self._writer(batch)

    def _put_back(self, batch: dict[Bucket, Counts]) -> None:
        # Under what gathered meanwhile: nothing is lost.
        with self._lock:
            for bucket, counts in self._pending.items():
                batch.setdefault(bucket, Counts()).add(counts)
            self._pending = batch


RECORDER = UsageRecorder()


def start() -> None:
    """Write usage in the background from now on (the servers call it), every
    ``LLMGW_GATEWAY_USAGE_FLUSH_MS``."""
    RECORDER.interval = max(1, settings.LLMGW_GATEWAY_USAGE_FLUSH_MS) / 1000.0
    RECORDER.start()
