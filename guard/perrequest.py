"""One client request's judging, across its checks: a judge that failed on it is not
asked again for it, so a request judged on the way in and again on the way out (and a
stream's every window) waits at most one judge timeout in all when the judge hangs,
not one per check.

The gateway begins it when a request's judging starts (``begin``); it lives in the
request's context (a ``contextvars.ContextVar``), which the guard's check on the event
loop and on a thread (asgiref copies the context) both read. A check outside a request
(the guard's API, the console's chat) has none and asks every judge as before.

A judge skipped for the request counts as failed, as one its breaker skips does
(``guard.breaker.Skipped``): the next judge of the chain is asked, and with none left
the policy's ``fail`` decides (``fail: closed`` still refuses, so nothing unjudged gets
through). Only failures of an earlier check skip a judge: a check that reads its
snapshot again after a failure (``guard.checks.check``) may still ask the judge anew.
"""

from __future__ import annotations

import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field

from guard import breaker


@dataclass
class RequestJudging:
    """The judges that failed on one request, each with when (monotonic) and how."""

    failed: dict[str, tuple[float, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, judge: str, kind: str) -> None:
        with self.lock:
            self.failed.setdefault(judge, (time.monotonic(), kind))

    def skip(self, judge: str, since: float) -> None:
        """Raise ``Skipped`` for a judge that failed on this request before ``since``."""
        with self.lock:
            seen = self.failed.get(judge)
        if seen is not None and seen[0] < since:
            raise breaker.Skipped(
                f"not asked again for this request: it failed on it already ({seen[1]})"
            )


_current: ContextVar[RequestJudging | None] = ContextVar("llmgw_request_judging", default=None)


def begin() -> RequestJudging:
    """Begin a request's judging in the current context (the request's task)."""
    judging = RequestJudging()
    _current.set(judging)
    return judging


def current() -> RequestJudging | None:
    """The request's judging in this context, or None outside a request."""
    return _current.get()
