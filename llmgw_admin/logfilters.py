"""Filters on the process's log, connected in the settings' ``LOGGING``."""

from __future__ import annotations

import logging
import time

# Answers the agents ask for and expect, in their ordinary course: a model the mirror does
# not hold (404: the node uses its own source) or has not fetched yet (409: the node
# retries, and its replica's reason says why). Django's request log called each one a
# warning, a line a node a retry on the console of the first start.
AGENT_PATHS = ("/api/v1/updates/mirror/models/",)
AGENT_STATUSES = (404, 409)


class AgentAnswers(logging.Filter):
    """Leave out ``django.request``'s warning for an agent's expected 404 or 409."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        path = getattr(request, "path", "") or ""
        status = getattr(record, "status_code", None)
        return not (status in AGENT_STATUSES and path.startswith(AGENT_PATHS))


class Repeats(logging.Filter):
    """A traceback logged again and again (Celery beat's ``Message Error`` each time it
    cannot send a task while Redis is away, with the stack in the message): the first of a
    run whole, then one line a minute (the message's first line, the error, how many were
    left out), as the gateway logs its failed reads. A run ends after a minute without it:
    the next one is whole again. Connected in the settings' ``LOGGING``."""

    EVERY_S = 60.0

    def __init__(self) -> None:
        super().__init__()
        # By the record's message template: (when last passed, when last seen, left out).
        self._seen: dict[str, tuple[float, float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or record.levelno < logging.WARNING:
            return True
        now = time.monotonic()
        key = str(record.msg)
        passed, seen, left = self._seen.get(key, (-self.EVERY_S, -self.EVERY_S, 0))
        if now - seen >= self.EVERY_S:  # a new run: whole
            self._seen[key] = (now, now, 0)
            return True
        if now - passed < self.EVERY_S:
            self._seen[key] = (passed, now, left + 1)
            return False
        self._seen[key] = (now, now, 0)
        exc = record.exc_info[1]
        first = record.getMessage().splitlines()[0] if record.getMessage() else ""
        record.msg = "%s (%s: %s); %d more like it in the last minute, said once a minute"
        record.args = (first, type(exc).__name__, exc, left)
        record.exc_info = None
        record.exc_text = None
        return True


class UTCFormatter(logging.Formatter):
    """Times in UTC with milliseconds, ``2026-01-02 03:04:05.678Z``, whatever the machine's
    zone."""

    converter = time.gmtime
    default_time_format = "%Y-%m-%d %H:%M:%S"
    default_msec_format = "%s.%03dZ"
