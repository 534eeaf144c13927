"""The guard as the gateway asks it: on the event loop when the guard holds what it needs,
else on a few threads of the gateway's own (``guard.services.check``), never per request
when nothing is judged.

Each judge's circuit breaker in this process (``guard.services.BREAKERS``) is exported to
``/metrics`` as it changes: ``llmgw_guard_judge_breaker{judge,state,pid}``, 1 for the
state it is in (``closed``, ``open``, ``half_open``) and 0 for the others, per live
process.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

from guard import breaker, services
from guard.policy import ANSWERS, REQUESTS

THREADS = 16
_executor = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="gateway-guard")


def _check(request: str, answer: str | None, asked: Any) -> dict[str, Any]:
    try:
        return services.check(request, answer, asked=asked)
    finally:
        connection.close()


_check_on_pool = sync_to_async(_check, thread_sensitive=False, executor=_executor)

_gauge: Any = None
_gauge_lock = threading.Lock()


def breaker_metric(judge: str, state: breaker.State) -> None:
    """Set a judge's breaker gauge (``guard.breaker.Breakers``' listener)."""
    global _gauge
    with _gauge_lock:
        if _gauge is None:
            from prometheus_client import Gauge

            from gateway import metrics

            metrics._setup()  # the multiprocess mode, before any metric is made
            _gauge = Gauge("llmgw_guard_judge_breaker",
                           "a judge's circuit breaker in this process: 1 for its state",
                           ("judge", "state"), multiprocess_mode="liveall",
                           registry=None)  # fmt: skip
    for name in breaker.STATES:
        _gauge.labels(judge, name).set(1 if name == state.state else 0)


services.BREAKERS.listen(breaker_metric)


class Guard:
    def directions(self) -> tuple[bool, bool]:
        """Whether requests and answers are judged, by the policy in memory. Unknown (not
        in memory yet): both, so the check reads the policy and decides (it answers
        ``allow`` with ``judged: false`` for a direction it does not judge)."""
        policy = services.policy_in_memory()
        if policy is None:
            return True, True
        return policy.judges(REQUESTS), policy.judges(ANSWERS)

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        done = await services.check_on_loop(request, answer)
        if isinstance(done, dict):
            return done
        return await _check_on_pool(request, answer, done)
