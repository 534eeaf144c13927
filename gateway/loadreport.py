"""This gateway process's load, reported once a second for the reconciler's scaling.

``gateway.traffic``'s thread calls :meth:`LoadReport.tick` each second with the seconds it
just took: the report is the process's requests in flight per model now (on the
model's ready replicas), its requests waiting for a replica of a model (one scaled to
zero, or starting), and its answers' TTFT counts over the last ``cluster.load.WINDOW``
seconds. It is written in the cluster's format (``cluster.load``: Redis with a TTL in
production, this process's memory embedded). Off the request path: a copy of two dicts
the request path keeps anyway, no lock it takes. A write that fails is logged once a
minute and dropped; the next second brings fresh figures, and a report not renewed
expires by itself.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from cluster import load
from gateway.traffic import EDGES_MS

log = logging.getLogger(__name__)

LOG_EVERY = 60.0


class LoadReport:
    """Samples one gateway's counts and writes them (``tick``, from traffic's thread)."""

    def __init__(self, gateway: Any, process: str) -> None:
        self.gateway = gateway
        self.process = process
        self.seconds: deque[tuple[int, dict[str, list[int]]]] = deque()
        self._logged = 0.0
        self.failures = 0

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

        state = self.gateway.state
        table = state.table
        in_flight = dict(self.gateway.in_flight)  # one C-level copy: safe beside the loop
        for name, pool in list(table.pools.items()):
            count = sum(in_flight.get(replica, 0) for replica in pool.endpoints)
            if count:
                of(name)["in_flight"] = count
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
        try:
            load.write(self.report(items))
        except Exception as error:
            self.failures += 1
            now = time.monotonic()
            if now - self._logged >= LOG_EVERY:
                self._logged = now
                log.warning("could not report the gateway's load for scaling (%d failed so "
                            "far): %s", self.failures, error)  # fmt: skip
