"""Writing what checks did (answers, failures, decisions) off the request path.

A check adds its result to the process's ``Recorder`` (in memory, under a lock: a few
microseconds); a background thread writes what has gathered every ``LLMGW_GUARD_FLUSH_MS``
milliseconds (500) in one transaction: per judge one upsert of its counts, per decision key one.
Counts are added in the database (``count = count + n``), so they stay exact with any
number of processes and flushes; a flush that fails puts its counts back to be written
with the next one; ``stop`` (and the process's exit, through ``atexit``) writes what is
left.

Each judge's circuit breaker (``guard.breaker``, per process) is written the same way
when it changes state, one row per judge and process (``JudgeBreaker``), for the console.

The web process's server starts the recorder (``llmgw_admin/server.py``; importing the
application starts nothing). Elsewhere (the ``guard``
command, Celery's probe, tests) nothing is started and ``guard.checks.record`` writes
each result at once, through the same ``write``.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When

from guard.breaker import State as BreakerState
from guard.chain import NO_JUDGE, ChainResult, Stats
from guard.models import JudgeBreaker, JudgeDecision, JudgeHealth
from llmgw_core import events
from llmgw_core.batches import Batcher
from llmgw_core.processes import alive

log = logging.getLogger(__name__)

# The longest error message kept per judge.
ERROR_CHARS = 2000


def write(stats: Stats) -> None:
    """Add counts to the database in one transaction: judges' health, then decisions.

    Rows are touched in name order, so two processes flushing at once cannot deadlock.
    The last error and the last good answer replace the stored ones only when newer.
    """
    judges = sorted(set(stats.health) | set(stats.answers) | set(stats.last_good))
    breakers = sorted(stats.breakers)
    decisions: Counter[tuple[str, str, str]] = Counter()
    for key, n in stats.decisions.items():
        if key.judge != NO_JUDGE:  # all failed: the failures are counted per judge
            decisions[(key.judge, key.verdict, key.category)] += n
    if not judges and not decisions and not breakers:
        return
    with transaction.atomic():
        for judge in breakers:
            _write_breaker(judge, stats.breakers[judge])
        if judges:
            JudgeHealth.objects.bulk_create(
                [JudgeHealth(judge=j) for j in judges], ignore_conflicts=True
            )
        for judge in judges:
            changes: dict[str, object] = {}
            h = stats.health.get(judge)
            if h is not None and h.failures:
                changes["failures"] = F("failures") + h.failures
            if h is not None and h.last_failed_at is not None:
                newer = Q(last_error_at__isnull=True) | Q(last_error_at__lte=h.last_failed_at)
                changes["last_error"] = _if(newer, h.last_error[:ERROR_CHARS], "last_error")
                changes["last_error_kind"] = _if(newer, h.last_kind, "last_error_kind")
                changes["last_error_at"] = _if(newer, h.last_failed_at, "last_error_at")
            if stats.answers.get(judge):
                changes["answers"] = F("answers") + stats.answers[judge]
            good = stats.last_good.get(judge)
            if good is not None:
                at, latency = good
                newer = Q(last_good_at__isnull=True) | Q(last_good_at__lte=at)
                changes["last_good_at"] = _if(newer, at, "last_good_at")
                changes["last_latency_ms"] = _if(newer, latency, "last_latency_ms")
            if changes:
                JudgeHealth.objects.filter(judge=judge).update(**changes)
        keys = sorted(decisions)
        if keys:
            JudgeDecision.objects.bulk_create(
                [JudgeDecision(judge=j, verdict=v, category=c) for j, v, c in keys],
                ignore_conflicts=True,
            )
        for j, v, c in keys:
            JudgeDecision.objects.filter(judge=j, verdict=v, category=c).update(
                count=F("count") + decisions[(j, v, c)]
            )
        # The consoles show these counts: pushed once this commits (one event per flush).
        events.changed(judges=[*judges, *(j for j, _, _ in keys), *breakers])


def process_name() -> str:
    """This process as breaker rows name it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _at(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, tz=UTC)


def _write_breaker(judge: str, s: BreakerState) -> None:
    JudgeBreaker.objects.update_or_create(
        judge=judge[:200],
        process=process_name(),
        defaults={
            "state": s.state, "since": _at(s.since), "opened_at": _at(s.opened_at),
            "next_probe": _at(s.next_probe), "backoff": s.backoff, "failures": s.failures,
            "last_kind": s.last_kind[:40], "updated": datetime.now(UTC),
        },
    )  # fmt: skip


def breaker_changed(judge: str, state: BreakerState) -> None:
    """A judge's breaker changed state in this process (``guard.breaker.Breakers``'
    listener): written with the next flush, or at once where no recorder runs."""
    if RECORDER.running:
        RECORDER.add_breaker(judge, state)
        return
    try:
        write(Stats(breakers={judge: state}))
    except Exception:  # the console's view of it: never the check's failure
        log.warning("the breaker of judge %s could not be written", judge, exc_info=True)


def forget_dead_processes() -> int:
    """Delete the breaker rows of processes of this host no longer running; return how
    many went (a process that starts calls it)."""
    host = socket.gethostname()
    gone = []
    for process in set(
        JudgeBreaker.objects.filter(process__startswith=f"{host}:").values_list(
            "process", flat=True
        )
    ):
        pid = process.rsplit(":", 1)[-1]
        if pid.isdigit() and not alive(int(pid)):
            gone.append(process)
    if not gone:
        return 0
    return JudgeBreaker.objects.filter(process__in=gone).delete()[0]


def _if(condition: Q, value: object, column: str) -> Case:
    """Return ``value`` where ``condition`` holds, else the column's own (an UPDATE's SET)."""
    field = JudgeHealth._meta.get_field(column)
    return Case(
        When(condition, then=Value(value, output_field=field)),
        default=F(column),
        output_field=field,
    )


def flush_interval() -> float:
    """How often the background thread writes what checks did (seconds), from
    ``LLMGW_GUARD_FLUSH_MS``: what another process's reader (the judges' page, the API)
    may lag behind."""
    return max(1, settings.LLMGW_GUARD_FLUSH_MS) / 1000.0


class Recorder(Batcher):
    """Gathers checks' results in memory; a background thread writes them in batches
    (``llmgw_core.batches``).

    ``interval``: seconds between writes (``flush_interval()``, the setting's, when not
    given); ``writer`` is what writes a batch (``write``; a test may pass one that fails).
    """

    thread_name = "guard-recorder"
    what = "the guard's counts"

    def __init__(
        self, interval: float | None = None, writer: Callable[[Stats], None] = write
    ) -> None:
        self._init_batches(flush_interval() if interval is None else interval)
        self._writer = writer
        self._lock = threading.Lock()  # guards _pending
        self._pending = Stats()

    def add(self, result: ChainResult) -> None:
        """Count one check's result, to be written by the next flush."""
        with self._lock:
            self._pending.record(result)

    def add_breaker(self, judge: str, state: BreakerState) -> None:
        """A judge's breaker as it changed, to be written by the next flush."""
        with self._lock:
            self._pending.breakers[judge] = state

    def pending(self) -> bool:
        """Return whether anything waits to be written."""
        with self._lock:
            return not self._pending.empty()

    def _take(self) -> Stats | None:
        with self._lock:
            batch = self._pending.take()
        return None if batch.empty() else batch

    def _write(self, batch: Stats) -> None:
        self._writer(batch)

    def _put_back(self, batch: Stats) -> None:
        # Under what gathered meanwhile: nothing is lost.
        with self._lock:
            batch.merge(self._pending)
            self._pending = batch


RECORDER = Recorder()


def start() -> None:
    """Write checks' results in the background from now on (the web process calls it),
    every ``LLMGW_GUARD_FLUSH_MS``."""
    RECORDER.interval = flush_interval()
    RECORDER.start()
    try:
        forget_dead_processes()
    except Exception:  # the database away at the start: the rows stay a while longer
        log.warning("the breaker rows of stopped processes could not be deleted", exc_info=True)
