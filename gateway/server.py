"""``manage.py gateway serve``: the gateway alone on uvicorn, as many processes as a site
needs behind any load balancer. It answers ``/v1/`` only (``gateway.asgi``)."""

from __future__ import annotations

import signal
import sys
from typing import Any

APP = "gateway.asgi:application"
KEEP_ALIVE = 75
GRACE = 30


def run(bind: str, port: int) -> None:
    import uvicorn

    from gateway import refusals, usage
    from guard import records

    signal.signal(signal.SIGTERM, _exit)
    # The guard's decisions on this process's traffic, its usage and its refusal records,
    # written off the request path.
    records.start()
    usage.start()
    refusals.start()
    uvicorn.Server(
        uvicorn.Config(
            APP,
            host=bind,
            port=port,
            lifespan="off",
            access_log=False,
            log_level="warning",
            proxy_headers=False,
            timeout_keep_alive=KEEP_ALIVE,
            timeout_graceful_shutdown=GRACE,
        )  # fmt: skip
    ).run()


def _exit(signum: int, frame: Any) -> None:
    sys.exit(0)
