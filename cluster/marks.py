"""The control plane's marks (cluster.models.ControlMark): since when heartbeats can be
heard, and when the reconciler last finished a tick and in which process.

Each is one row kept current, written once at a web process's start and once a tick:
nothing here is on a hot path.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from cluster.models import ControlMark

log = logging.getLogger(__name__)

# A tick older than this many reconcile intervals (and STALE_MIN_S) is worth a warning.
STALE_INTERVALS = 3
STALE_MIN_S = 5.0


def who(role: str) -> str:
    """Return how a process is named in the marks: its role, host and process id."""
    return f"{role} on {socket.gethostname()} (pid {os.getpid()})"


def listening(role: str = "web process", at: datetime | None = None) -> None:
    """Note that this process hears heartbeats from now (a web process, as it starts).

    The reconciler counts a node's silence only from the latest such start: silence while
    no web process was up is the control plane's (cluster.silence). A database that
    cannot be written is logged, not raised: the process serves anyway.
    """
    try:
        ControlMark.objects.update_or_create(
            kind=ControlMark.HEARTBEATS, defaults={"at": at or timezone.now(), "by": who(role)}
        )
    except DatabaseError as exc:
        log.warning("could not note when heartbeats are heard from (%s)", exc)


def heard_since() -> datetime | None:
    """Return since when heartbeats can be heard (the latest web process's start), if known."""
    mark = ControlMark.objects.filter(kind=ControlMark.HEARTBEATS).first()
    return mark.at if mark else None


def ticked(by: str, at: datetime | None = None) -> None:
    """Note that the reconciler finished a tick, in the process ``by``."""
    ControlMark.objects.update_or_create(
        kind=ControlMark.TICK, defaults={"at": at or timezone.now(), "by": by}
    )


@dataclass(frozen=True)
class TickStatus:
    """The reconciler's last tick as the console and the API show it."""

    at: datetime | None
    by: str
    age_s: float | None
    interval_s: float
    stale_after_s: float
    warning: str

    @property
    def stale(self) -> bool:
        """Return whether the reconciler seems to have stopped."""
        return bool(self.warning)

    def as_dict(self) -> dict[str, object]:
        """Return the status for the API (``GET /api/v1/cluster/status``)."""
        return {
            "last_tick": self.at.isoformat() if self.at else None,
            "by": self.by,
            "age_s": None if self.age_s is None else round(self.age_s, 1),
            "interval_s": self.interval_s,
            "stale_after_s": self.stale_after_s,
            "stale": self.stale,
            "warning": self.warning,
        }


def tick_status(now: datetime | None = None) -> TickStatus:
    """Return the last tick's time, age and process, with a warning when it is too old."""
    now = now or timezone.now()
    interval = float(settings.LLMGW_RECONCILE_INTERVAL)
    stale_after = max(STALE_INTERVALS * interval, STALE_MIN_S)
    mark = ControlMark.objects.filter(kind=ControlMark.TICK).first()
    where = (
        "the worker and beat (docs/production.md)"
        if settings.REDIS_URL
        else "the web process (manage.py serve)"
    )
    if mark is None:
        return TickStatus(
            None, "", None, interval, stale_after,
            f"the reconciler has not run yet: nothing is placed, no node is found lost; check {where}",
        )  # fmt: skip
    age = max(0.0, (now - mark.at).total_seconds())
    warning = ""
    if age > stale_after:
        warning = (
            f"the reconciler has not run for {age:.0f} s (every {interval:g} s expected; last by "
            f"{mark.by}): nothing is placed or found lost meanwhile; check {where}"
        )
    return TickStatus(mark.at, mark.by, age, interval, stale_after, warning)
