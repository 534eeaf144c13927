"""Filters on the process's log, connected in the settings' ``LOGGING``."""

from __future__ import annotations

import logging

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
