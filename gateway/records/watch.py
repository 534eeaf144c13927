"""The canary watch: each gateway process judges its own canaries and rolls them back.

``CanaryWatch`` is an observer (``gateway.records.observe``): the Gateway tells it each request as
it ended and each failed attempt (``retried``). For the models in a canary (the model and
its candidate, read from the process's table) it keeps the last outcomes in memory, a
bounded window per model (appending one under a lock is all the request path does). A
thread of its own looks every ``interval`` seconds, asks ``gateway.path.canary.decide`` and,
when the candidate is to be rolled back, sets the canary's share to 0 through the
catalog's services (``roll_back``): logged as done by the gateway, with the figures, and
pushed to the consoles as every catalog change is (``catalog.signals``). A rollback is
written once: not again while it is being written, nor until the process's table shows
it; a failed write is tried again ``RETRY`` seconds later.

Several gateway processes each judge their own traffic, so the first whose window says
roll back writes it; the others find the share already 0 when they write (the row is
locked and read again first) and write nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from django.db import close_old_connections, connection, transaction

from catalog.choices import Surface
from catalog.services import Actor, save_model, stored_queryset
from gateway.path import canary
from gateway.path.table import Table
from gateway.records.observe import Done, Listener

log = logging.getLogger(__name__)

INTERVAL = 0.5
# Outcomes kept per model: the window decided over (at least the canary's min_requests).
WINDOW = 1000
MAX_WINDOW = 100_000
# Seconds before a failed rollback write is tried again.
RETRY = 5.0

# One outcome: (failed, time to first token of a success or None).
Outcome = tuple[bool, float | None]


def actor() -> object:
    """Who the change log says rolled a canary back: the gateway, and which process."""
    return Actor(user=None, surface=Surface.GATEWAY, name="gateway",
                 via=f"{socket.gethostname()} pid {os.getpid()}")  # fmt: skip


def roll_back(model: str, candidate: str, why: str) -> bool:
    """Set ``model``'s canary share to 0 if it still sends some to ``candidate``; True when
    written. The row is locked and read again first: of several processes deciding at
    once, one writes."""
    with transaction.atomic():
        row = stored_queryset().select_for_update().filter(name=model).first()
        if row is None:
            return False
        m = row.to_spec()
        if m.canary is None or m.canary.model != candidate or m.canary.percent == 0:
            return False
        save_model(replace(m, canary=replace(m.canary, percent=0)), actor(),  # type: ignore[arg-type]
                   replacing=model, note=why)  # fmt: skip
    return True


class CanaryWatch(Listener):
    """Windows of the canaries' outcomes, and the thread that rolls candidates back.

    ``table`` returns the process's current table (``lambda: state.table``); ``write`` is
    what rolls back (``roll_back``; a test may pass its own). The thread starts with the
    first request heard (``start_on_request``; a test may call ``check`` itself instead).
    """

    def __init__(
        self,
        table: Callable[[], Table],
        *,
        interval: float = INTERVAL,
        write: Callable[[str, str, str], bool] = roll_back,
        start_on_request: bool = True,
    ) -> None:
        super().__init__()
        self._table = table
        self.interval = interval
        self._write = write
        self._start_on_request = start_on_request
        self._lock = threading.Lock()
        self._windows: dict[str, deque[Outcome]] = {}
        # What the request path records: the models of canaries with a share, and the
        # window each keeps (set by the thread from the table).
        self.tracked: dict[str, int] = {}
        # model -> (candidate, monotonic time the rollback was written or failed, ok)
        self._rolling: dict[str, tuple[str, float, bool]] = {}
        self.rolled: list[tuple[str, str, str]] = []  # (model, candidate, why) written
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # The request path: a few dictionary look-ups and an append.
    def request(self, done: Done) -> None:
        if self._thread is None and self._start_on_request:
            self.start()
        if done.model not in self.tracked or done.status == 499 or done.replica is None:
            return  # not a canary's, the client went away, or no engine was reached
        failed = done.status >= 500
        ttft = done.ttft if not failed and done.status < 400 else None
        self._add(done.model, (failed, ttft))

    def retried(self, model: str) -> None:
        if model in self.tracked:
            self._add(model, (True, None))

    def _add(self, model: str, outcome: Outcome) -> None:
        with self._lock:
            window = self._windows.get(model)
            if window is None:
                size = self.tracked.get(model)
                if size is None:
                    return
                window = self._windows[model] = deque(maxlen=size)
            window.append(outcome)

    def window(self, model: str) -> canary.Window:
        """What the kept outcomes of ``model`` come to."""
        with self._lock:
            outcomes = list(self._windows.get(model, ()))
        errors = sum(1 for failed, _ in outcomes if failed)
        ttfts = [t for failed, t in outcomes if not failed and t is not None]
        return canary.Window(len(outcomes), errors, sum(ttfts), len(ttfts))

    # The thread.
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread (once; the first request does, or the server)."""
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is not None:
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gateway-canary", daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
        self._thread = None

    def _run(self) -> None:
        try:
            self.check()
            while not self._stop.wait(self.interval):
                close_old_connections()
                self.check()
        finally:
            with contextlib.suppress(Exception):
                connection.close()

    def check(self, now: float | None = None) -> None:
        """One look: what to track from the table, and each canary judged."""
        table = self._table()
        now = time.monotonic() if now is None else now
        tracked: dict[str, int] = {}
        canaries: list[tuple[str, str, str, canary.Limits]] = []
        for m in table.models.values():
            c = m.canary
            # The candidate may be named by an alias: its outcomes are the model's it means.
            candidate = table.model_named(c.model) if c is not None else None
            if c is None or c.percent <= 0 or candidate is None or candidate == m.name:
                continue
            limits = canary.Limits.of(c)
            size = min(max(WINDOW, limits.min_requests), MAX_WINDOW)
            tracked[m.name] = max(size, tracked.get(m.name, 0))
            tracked[candidate] = max(size, tracked.get(candidate, 0))
            canaries.append((m.name, candidate, c.model, limits))
        self.tracked = tracked
        with self._lock:
            for name in list(self._windows):
                if name not in tracked:
                    del self._windows[name]  # no canary any more: start afresh next time
        live = {name for name, _, _, _ in canaries}
        for name in list(self._rolling):
            candidate, at, ok = self._rolling[name]
            if name not in live or (ok and table.built > at) or (not ok and now - at >= RETRY):
                # The table shows it (or the canary changed), or a failed write may be tried
                # again: judge afresh from new outcomes.
                del self._rolling[name]
                if ok or name not in live:
                    self._clear(name, candidate)
        for name, candidate, reference, limits in canaries:
            if name in self._rolling:
                continue
            decision = canary.decide(self.window(candidate), self.window(name), limits, candidate)
            if not decision.roll_back:
                continue
            try:
                # Written against the canary as the catalog names it (an alias, maybe).
                written = self._write(name, reference, decision.why)
            except Exception:
                log.exception("the gateway could not roll back canary %s of %s", candidate, name)
                self._rolling[name] = (candidate, now, False)
                continue
            self._rolling[name] = (candidate, time.monotonic(), True)
            if written:
                log.warning("%s", decision.why)
                self.rolled.append((name, candidate, decision.why))

    def _clear(self, *models: str) -> None:
        with self._lock:
            for name in models:
                self._windows.pop(name, None)
