"""The updates app's receivers, connected by ``connect()`` (``UpdatesConfig.ready``).

- **Each reconcile tick** (the cluster's ``reconcile_tick``) looks once at every running
  update and moves it as its step decides (``updates.run.advance_all``): the flow moves
  with the cluster it waits on (a candidate placed and ready, a canary's requests).
"""

from __future__ import annotations

import logging
from typing import Any

from cluster.signals import reconcile_tick

log = logging.getLogger(__name__)


def _tick(sender: Any, **kwargs: Any) -> None:
    from updates import run

    try:
        run.advance_all()
    except Exception:
        log.exception("moving the running updates failed; the next tick tries again")


def connect() -> None:
    """Connect the updates app's receivers (once; ``dispatch_uid`` keeps it so)."""
    reconcile_tick.connect(_tick, dispatch_uid="updates-advance")
