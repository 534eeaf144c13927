"""The agents' calls gathered and done many in one statement, by one thread a process.

Every agent heartbeats every few seconds (docs/agent-protocol.md): one statement and one
pooled connection each cost the web process more than the rest of the call together
(bench/agents.py). Here a call that the database answers the same way for many agents
(an unchanged inventory's stamp, a desired list's node) is handed to ``Coalescer``: its
thread takes everything queued at once, does the whole batch with ``run`` (one or two
statements, on one connection) and answers each waiting call on its event loop. The calls
that gather while a batch is written make the next batch; the thread never waits for
more (a thread found idle writes the call that woke it alone): once the statements found
their nodes by index, a wait of 2 ms for more saved little CPU (bench/agents.py:
PostgreSQL's 0.13 against 0.16 ms a request at 5,000 agents, 0.10 against 0.11 ms at
2,000; the web processes' the same) and added its 2 ms to every answer. The answer still waits for its write:
what the agent is told (its node, cordoned or not, the desired list's version) is what
the database held when its heartbeat was stamped, as before.

Bounds, each with its outcome (the caller says what it answers):

- ``submit`` returns None when ``MAX_QUEUED`` calls already wait (the database is slow
  or away): the call is not queued.
- A call not answered within its caller's wait (``wait``) is given up: ``GAVE_UP``; one
  not yet taken into a batch is dropped from the queue, so it is never written late.
- A batch that raises answers each of its calls ``FAILED`` (logged once in a row, then
  one line a minute); the next batch is tried afresh on a new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.db import connection

log = logging.getLogger(__name__)

# Calls in one statement at most; calls waiting at most (past it a call is not queued).
MAX_BATCH = 1000
MAX_QUEUED = 20_000
# Seconds between the one-line reports of batches failing in a row.
FAILURE_LOG_EVERY = 60.0


class Outcome:
    """What a call came to when its batch did not answer it."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


FAILED = Outcome("FAILED")  # its batch raised (the database refused or broke)
GAVE_UP = Outcome("GAVE_UP")  # not answered within the wait


@dataclass
class _Call:
    item: Any
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


def _settle(done: list[tuple[asyncio.Future[Any], Any]]) -> None:
    for future, outcome in done:
        if not future.done():
            future.set_result(outcome)


class Coalescer:
    """Many calls, one batch at a time, on a thread of its own (see the module).

    ``run(items)`` returns one outcome for each item, in order; it runs on the thread,
    on the thread's database connection, kept from batch to batch while calls wait (the
    pool's check of a connection handed out costs a round trip) and handed back when
    none do or a batch fails.
    """

    def __init__(
        self,
        run: Callable[[Sequence[Any]], Sequence[Any]],
        name: str,
        *,
        max_batch: int = MAX_BATCH,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self.run = run
        self.name = name
        self.max_batch = max_batch
        self.max_queued = max_queued
        self._queue: list[_Call] = []
        self._lock = threading.Lock()
        self._draining = False
        # One thread, idle in the library between drains (a drain ends when the queue is
        # empty); submit starts the next.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.failures = 0  # batches failed in a row
        self._failure_logged = -float("inf")

    def submit(self, item: Any) -> asyncio.Future[Any] | None:
        """Queue ``item``; return the future its outcome is set on, or None when
        ``max_queued`` calls already wait. Called on the event loop that awaits it."""
        loop = asyncio.get_running_loop()
        call = _Call(item, loop, loop.create_future())
        with self._lock:
            if len(self._queue) >= self.max_queued:
                return None
            self._queue.append(call)
            if not self._draining:
                self._draining = True
                self._executor.submit(self._drain)
        return call.future

    async def call(self, item: Any, wait: float) -> Any:
        """Queue ``item`` and return its outcome: ``run``'s, FAILED, or GAVE_UP (the queue
        full, or no answer within ``wait`` seconds)."""
        future = self.submit(item)
        if future is None:
            return GAVE_UP
        timer = asyncio.get_running_loop().call_later(wait, self._give_up, future)
        try:
            return await future
        finally:
            timer.cancel()

    def _give_up(self, future: asyncio.Future[Any]) -> None:
        if future.done():
            return
        future.set_result(GAVE_UP)
        with self._lock:
            # Not taken yet: never written, so never late.
            self._queue = [c for c in self._queue if c.future is not future]

    def _take(self) -> list[_Call]:
        with self._lock:
            batch = [c for c in self._queue[: self.max_batch] if not c.future.done()]
            del self._queue[: self.max_batch]
            return batch

    def _drain(self) -> None:
        """Do batches until the queue is empty (on the thread: one drain at a time)."""
        try:
            while True:
                batch = self._take()
                if batch:
                    self._do(batch)
                with self._lock:
                    if not self._queue:
                        self._draining = False
                        return
        except BaseException:
            with self._lock:
                self._draining = False
            raise
        finally:
            # Back to the pool while nothing waits: the web process's requests share it
            # (the pool checks it when it is taken again, and throws a broken one away).
            connection.close()

    def _do(self, batch: list[_Call]) -> None:
        try:
            outcomes = list(self.run([c.item for c in batch]))
            if self.failures:
                log.warning("%s: batches succeed again after %d failed", self.name, self.failures)
            self.failures = 0
        except Exception:
            self.failures += 1
            now = time.monotonic()
            if self.failures == 1:
                log.exception("%s: a batch of %d calls failed", self.name, len(batch))
                self._failure_logged = now
            elif now - self._failure_logged >= FAILURE_LOG_EVERY:
                log.warning("%s: %d batches failed in a row", self.name, self.failures)
                self._failure_logged = now
            outcomes = [FAILED] * len(batch)
            connection.close()  # a broken connection is not used again
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Any]]] = {}
        for c, outcome in zip(batch, outcomes, strict=True):
            by_loop.setdefault(c.loop, []).append((c.future, outcome))
        for loop, done in by_loop.items():
            # A loop closed (RuntimeError) has no one waiting for these.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, done)
