"""The gateway app's receivers, connected by ``connect()`` (``GatewayConfig.ready``).

- **Each reconcile tick** (the cluster's ``reconcile_tick``) refreshes the federated peers
  due for it (``gateway.peers.refresh_due``: each peer's ``/v1/models`` read at most every
  ``LLMGW_FEDERATION_REFRESH`` seconds). The reads run beside the tick, never in it (a
  peer may be slow, up to ``LLMGW_FEDERATION_TIMEOUT`` each): on a thread of the process
  the tick runs in, one at a time; a tick while one runs skips.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import close_old_connections

from cluster.signals import reconcile_tick
from gateway import peers
from gateway.models import Peer

log = logging.getLogger(__name__)

_refreshing = threading.Lock()
# The last refresh's thread (tests wait on it).
last: threading.Thread | None = None


def _tick(sender: Any, **kwargs: Any) -> None:
    global last
    try:
        if not Peer.objects.exists():
            return
        if _refreshing.acquire(blocking=False):
            last = threading.Thread(target=_refresh, name="federation-refresh", daemon=True)
            last.start()
    except Exception:
        log.exception("refreshing the federated peers failed; the next tick tries again")


def _refresh() -> None:
    try:
        peers.refresh_due()
    except Exception:
        log.exception("refreshing the federated peers failed; the next tick tries again")
    finally:
        _refreshing.release()
        close_old_connections()


def connect() -> None:
    """Connect the gateway app's receivers (once; ``dispatch_uid`` keeps it so)."""
    reconcile_tick.connect(_tick, dispatch_uid="gateway-federation-refresh")
