"""What the gateway served, written off the request path in batches (``gateway.models.Usage``).

``UsageRecorder`` is an observer (``gateway.observe``): the Gateway tells it each request
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
its tokens as the engine's usage said. A client that went away (499) counts as a request
and nothing else.
"""

from __future__ import annotations

import atexit
import contextvars
import datetime as dt
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import F

from gateway.observe import Done, Observer

log = logging.getLogger(__name__)

FLUSH_INTERVAL = 1.0
# Buckets gathered at most between two flushes (a database away for long): past it new
# buckets are dropped, counted and logged, and memory stays bounded.
MAX_PENDING = 100_000

Bucket = tuple[int, str, str, str]  # (minute as Unix seconds, key, owner, model)
FIELDS = ("requests", "errors", "tokens_in", "tokens_out", "refusals")

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

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.errors += other.errors
        self.tokens_in += other.tokens_in
        self.tokens_out += other.tokens_out
        self.refusals += other.refusals


def write(batch: dict[Bucket, Counts]) -> None:
    """Add a batch's counts to the database in one transaction.

    Rows are touched in bucket order, so two processes flushing at once cannot deadlock.
    """
    from gateway.models import Usage

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


class UsageRecorder(Observer):
    """Gathers requests' usage in memory; a background thread writes it in batches.

    ``writer`` writes a batch (``write``; a test may pass one that fails); ``clock``
    gives the Unix time a request ended at.
    """

    def __init__(
        self,
        interval: float = FLUSH_INTERVAL,
        writer: Callable[[dict[Bucket, Counts]], None] = write,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__()
        import time

        self.interval = interval
        self._writer = writer
        self._clock = clock or time.time
        self._lock = threading.Lock()  # guards _pending
        self._flushing = threading.Lock()  # one flush at a time
        self._pending: dict[Bucket, Counts] = {}
        self.dropped = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            if refused:
                counts.refusals += 1
            elif done.status >= 400 and done.status != 499:
                counts.errors += 1
            counts.tokens_in += done.tokens_in
            counts.tokens_out += done.tokens_out

    def refused(self, direction: str, judge: str, categories: tuple[str, ...]) -> None:
        _refused.set(True)

    def pending(self) -> dict[Bucket, Counts]:
        """A copy of what waits to be written."""
        with self._lock:
            return {b: Counts(**vars(c)) for b, c in self._pending.items()}

    def flush(self) -> None:
        """Write what has gathered, in the calling thread; on failure keep it and raise."""
        with self._flushing:
            with self._lock:
                batch, self._pending = self._pending, {}
                dropped, self.dropped = self.dropped, 0
            if dropped:
                log.warning("the gateway's usage dropped %d requests (the database was away)",
                            dropped)  # fmt: skip
            if not batch:
                return
            try:
                self._writer(batch)
            except BaseException:
                # Put the batch back under what gathered meanwhile: nothing is lost.
                with self._lock:
                    for bucket, counts in self._pending.items():
                        batch.setdefault(bucket, Counts()).add(counts)
                    self._pending = batch
                raise

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the background thread (once), and write what is left at exit."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="gateway-usage", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the background thread and write what is left (in the calling thread)."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join()
            self._thread = None
        try:
            self.flush()
        except Exception:
            log.exception("the gateway's last usage counts could not be written")

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    close_old_connections()
                    self.flush()
                except Exception:
                    log.exception("writing the gateway's usage failed; trying again")
        finally:
            connection.close()


RECORDER = UsageRecorder()


def start() -> None:
    """Write usage in the background from now on (the servers call it), every
    ``LLMGW_GATEWAY_USAGE_FLUSH_MS``."""
    RECORDER.interval = max(1, settings.LLMGW_GATEWAY_USAGE_FLUSH_MS) / 1000.0
    RECORDER.start()
