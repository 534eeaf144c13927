"""This gateway process's load, reported once a second for the reconciler's scaling.

``gateway.records.traffic``'s thread calls :meth:`LoadReport.tick` each second with the seconds it
just took: the report is the process's requests in flight per model (on the model's
ready replicas; the mean of samples taken every ``SAMPLE_EVERY`` seconds over the last
``SMOOTH`` seconds by a thread of its own, so one instant between two requests does not
read as no load), its requests waiting for a replica of a model (one scaled to zero, or
starting), and its answers' TTFT counts over the last ``cluster.load.WINDOW`` seconds. It is written in the cluster's format (``cluster.load``: Redis with a TTL in
production, this process's memory embedded). Off the request path: a copy of two dicts
the request path keeps anyway, no lock it takes. A write that fails is logged once a
minute and dropped; the next second brings fresh figures, and a report not renewed
expires by itself.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from cluster import load
from gateway.path.admission import EDGES_MS
from gateway.path.parts import Parts

log = logging.getLogger(__name__)

LOG_EVERY = 60.0
SAMPLE_EVERY = 0.1  # seconds between two samples of the requests in flight
SMOOTH = 2.0  # seconds the reported in-flight figure is the mean over


class LoadReport:
    """Samples one gateway's counts (its ``parts``' in-flight counts and table) and writes
    them (``tick``, from traffic's thread)."""

    def __init__(self, parts: Parts, process: str) -> None:
        self.parts = parts
        self.process = process
        self.seconds: deque[tuple[int, dict[str, list[int]]]] = deque()
        self._logged = 0.0
        self.failures = 0
        # (monotonic time, {model: in flight}) of the last SMOOTH seconds.
        self.samples: deque[tuple[float, dict[str, int]]] = deque()
        self._lock = threading.Lock()
        self._sampling = False

    def in_flight_now(self) -> dict[str, int]:
        """The requests in flight per model at this instant (a copy: safe beside the loop)."""
        in_flight = dict(self.parts.in_flight)  # one C-level copy
        # Less the capacity bench's (a key pinned to a replica): its overload is deliberate;
        # and a batch's lines that may not add replicas (gateway.batch: "scale_up").
        pinned = dict(self.parts.pinned_in_flight)
        out = {}
        for name, pool in list(self.parts.state.table.pools.items()):
            count = sum(max(0, in_flight.get(replica, 0) - pinned.get(replica, 0))
                        for replica in pool.endpoints)  # fmt: skip
            if count:
                out[name] = count
        return out

    def sample(self, now: float | None = None) -> None:
        """Take one sample, forgetting those older than ``SMOOTH``."""
        now = time.monotonic() if now is None else now
        counts = self.in_flight_now()
        with self._lock:
            self.samples.append((now, counts))
            while self.samples and self.samples[0][0] < now - SMOOTH:
                self.samples.popleft()

    def smoothed(self) -> dict[str, float]:
        """The mean requests in flight per model over the samples kept."""
        with self._lock:
            kept = list(self.samples)
        if not kept:
            return {name: float(n) for name, n in self.in_flight_now().items()}
        sums: dict[str, int] = {}
        for _, counts in kept:
            for name, n in counts.items():
                sums[name] = sums.get(name, 0) + n
        return {name: round(total / len(kept), 2) for name, total in sums.items()}

    def _sample_forever(self) -> None:
        while True:
            try:
                self.sample()
            except Exception:  # a table being swapped: the next sample reads the new one
                log.debug("could not sample the requests in flight", exc_info=True)
            time.sleep(SAMPLE_EVERY)

    def start_sampling(self) -> None:
        with self._lock:
            if self._sampling:
                return
            self._sampling = True
        threading.Thread(target=self._sample_forever, name="gateway-load", daemon=True).start()

    def report(self, items: list[dict[str, Any]], now: float | None = None) -> dict[str, Any]:
        """The report for now, given the traffic items of the seconds just taken."""
        now = time.time() if now is None else now
        by_second: dict[int, dict[str, list[int]]] = {}
        for item in items:
            by_second.setdefault(item["second"], {})[item["model"]] = item["ttft"]
        for second in sorted(by_second):
            self.seconds.append((second, by_second[second]))
        while self.seconds and self.seconds[0][0] < now - load.WINDOW:
            self.seconds.popleft()
        models: dict[str, dict[str, Any]] = {}

        def of(name: str) -> dict[str, Any]:
            return models.setdefault(name, {"in_flight": 0, "waiting": 0,
                                            "ttft": [0] * (len(EDGES_MS) + 1)})  # fmt: skip

        state = self.parts.state
        for name, mean in self.smoothed().items():
            if mean:
                of(name)["in_flight"] = mean
        waiters = getattr(state, "_waiters", {})
        for name, futures in list(waiters.items()):
            if futures:
                of(name)["waiting"] = len(futures)
        for _, counts in self.seconds:
            for name, ttft in counts.items():
                figures = of(name)
                figures["ttft"] = [a + b for a, b in zip(figures["ttft"], ttft, strict=True)]
        return {"process": self.process, "at": now, "edges": list(EDGES_MS), "models": models}

    def tick(self, items: list[dict[str, Any]]) -> None:
        """Write this second's report; a failure is logged (once a minute) and dropped."""
        self.start_sampling()
        try:
            load.write(self.report(items))
        except Exception as error:
            self.failures += 1
            now = time.monotonic()
            if now - self._logged >= LOG_EVERY:
                self._logged = now
                log.warning("could not report the gateway's load for scaling (%d failed so "
                            "far): %s", self.failures, error)  # fmt: skip
