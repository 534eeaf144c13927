"""The updates app's receivers, connected by ``connect()`` (``UpdatesConfig.ready``).

- **Each reconcile tick** (the cluster's ``reconcile_tick``) has every running update
  looked at once and moved as its step decides (``updates.run.advance_all``): the flow
  moves with the cluster it waits on (a candidate placed and ready, a canary's requests).
  The look runs beside the tick, never in it (a step may ask the registry): a worker's
  task in production, a thread of the process embedded, one at a time there; two looks
  at once skip each other's updates (``advance`` claims each row). The same look ends
  promoted candidates' handovers and says which fetches a dead worker left.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import close_old_connections
from django.utils import timezone

from cluster.signals import reconcile_tick
from updates import run
from updates.models import ACTIVE, Fetch, UpdateRun, UpdateState
from updates.tasks import advance_updates

log = logging.getLogger(__name__)


_looking = threading.Lock()


def _tick(sender: Any, **kwargs: Any) -> None:
    try:
        if not worth_a_look():
            return
        if settings.REDIS_URL:
            advance_updates.apply_async(expires=30)
        elif _looking.acquire(blocking=False):
            threading.Thread(target=_look, name="updates-advance", daemon=True).start()
    except Exception:
        log.exception("moving the running updates failed; the next tick tries again")


def worth_a_look() -> bool:
    """Whether a tick has anything for ``run.advance_all`` to do: an update running, one
    ended lately (its candidate to remove), a promoted candidate still taking its model's
    traffic, or a fetch into the mirror under way (one a dead worker left is said so)."""
    return (
        UpdateRun.objects.filter(state=UpdateState.RUNNING).exists()
        or _ended_recently()
        or UpdateRun.objects.filter(state=UpdateState.PROMOTED, handover_ended__isnull=True)
        .exclude(candidate="")
        .exists()
        or Fetch.objects.filter(state__in=ACTIVE).exists()
    )


def _ended_recently() -> bool:
    """Whether an update ended lately (its candidate may wait to be removed: run.sweep)."""
    since = timezone.now() - timedelta(seconds=run.DRAIN_S * 6)
    return UpdateRun.objects.filter(finished__gte=since).exclude(candidate="").exists()


def _look() -> None:
    try:
        run.advance_all()
    except Exception:
        log.exception("moving the running updates failed; the next tick tries again")
    finally:
        _looking.release()
        close_old_connections()


def connect() -> None:
    """Connect the updates app's receivers (once; ``dispatch_uid`` keeps it so)."""
    reconcile_tick.connect(_tick, dispatch_uid="updates-advance")
