"""The web process's HTTP and websocket server: uvicorn serving ``llmgw_admin.asgi``.

``manage.py serve`` runs it with the embedded mode's threads beside it; the benchmarks
run it alone (``python -m llmgw_admin.server --bind H --port P``), as one of production's
web processes.

Why uvicorn and not Daphne: a guard check is on every request a gateway serves, and
Daphne's own handling of one small request cost about 1 ms more than uvicorn's on these
machines (a constant answer over a kept-alive connection: 1.0 ms against 0.45 ms at
p50), with twice the CPU. uvicorn speaks HTTP/1.1 with httptools and runs on uvloop when
they are installed (both are pinned), else with h11 and asyncio; websockets with the
``websockets`` package.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from typing import Any

import django
import uvicorn
from django.apps import apps
from django.conf import settings
from django.db import connection

from gateway import listener
from llmgw_core import workers

APP = "llmgw_admin.asgi:application"
# Agents and gateways keep their connections open between calls: a heartbeat every few
# seconds, a check per request. uvicorn's default (5 s) would close them in between.
KEEP_ALIVE = 75
# Seconds a stop waits for requests in flight; open websockets are told to go (1012) at
# once, and the consoles reconnect to whichever process is serving.
GRACE = 10


def config(bind: str, port: int) -> Any:
    """Return the server's settings for one address."""
    return uvicorn.Config(
        APP,
        host=bind,
        port=port,
        # Channels' router speaks no lifespan protocol; nothing here needs one.
        lifespan="off",
        # Access lines for every agent call would bury what a person needs to read.
        access_log=False,
        log_level="warning",
        # The peer's address is the client's, as Daphne had it: X-Forwarded-For from
        # 127.0.0.1 is not believed.
        proxy_headers=False,
        ws="websockets-sansio",
        # No permessage-deflate: compressed, each console's copy of a change is deflated
        # on its own (its own compression context), about 0.1-0.2 ms of CPU a console and
        # a change, which 1,000 consoles made 0.1-0.2 s of every change (bench/live.py).
        # Sent as they are, every console of a role gets the same bytes; the pages
        # themselves are not compressed either.
        ws_per_message_deflate=False,
        # Headers within LLMGW_HTTP_HEADER_TIMEOUT, bodies within LLMGW_HTTP_BODY_TIMEOUT
        # (gateway.listener); idle kept-alive connections closed after KEEP_ALIVE.
        http=listener.from_settings(settings),
        timeout_keep_alive=KEEP_ALIVE,
        timeout_graceful_shutdown=GRACE,
    )


def run(bind: str, port: int) -> None:
    """Serve until SIGINT or SIGTERM, then return through ``SystemExit``.

    uvicorn stops gracefully on either signal and then raises it again with the handler
    that was there before it started. Python's default for SIGTERM ends the process at
    once, skipping ``atexit`` (the guard recorder's last counts, the local agent's stop),
    so a handler that exits the Python way is put there first.
    """
    signal.signal(signal.SIGTERM, _exit)
    _start_recorder()
    _note_listening()
    uvicorn.Server(config(bind, port)).run()


def run_workers(sock: Any, count: int, say: Any, warn: Any) -> int:
    """Serve on ``sock``'s address with ``count`` worker processes, as ``gateway serve
    --workers`` does (``gateway.server.run_workers``, ``llmgw_core.workers``): each on a
    socket of its own bound with ``SO_REUSEPORT``, the parent keeping ``sock``. Only in
    production (``LLMGW_REDIS_URL``): the consoles' live changes cross processes there."""
    # Imported here: it imports models, which load with the apps; this module runs before
    # django.setup() when run alone (``python -m llmgw_admin.server``).
    from gateway.server import Server, listen  # noqa: PLC0415

    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    def serve(ready: Any) -> None:
        sock.close()  # the parent's
        own = listen(host, port, shared=True)
        signal.signal(signal.SIGTERM, _exit)
        _start_recorder()
        _note_listening()
        Server(config(host, port), ready).run(sockets=[own])

    def serving(pids: list[int]) -> None:
        say(f"web process serving on http://{shown}:{port}/ (pid {os.getpid()}; {count} "
            f"workers: {', '.join(map(str, pids))})")  # fmt: skip

    return workers.Supervisor(count, serve, name="web process", grace=GRACE + 5, say=say,
                              warn=warn, serving=serving).run()  # fmt: skip


def _note_listening() -> None:
    """Note that heartbeats can be heard from now: nodes' silence counts from here.

    While no web process was up no heartbeat could be heard, and the reconciler (in a
    worker, which went on ticking) must not take that silence for the nodes'
    (cluster.silence).
    """
    if not apps.ready:
        django.setup()
    # Imported here: it imports models, which load with the apps (just above).
    from cluster import marks  # noqa: PLC0415

    marks.listening()
    connection.close()  # this thread serves no request


def _start_recorder() -> None:
    """Have what guard checks did written by a background thread, off each check's path
    (``guard.records``), from now until the stop, which writes the last counts (atexit).

    Started here, where the server starts, not when ``llmgw_admin.asgi`` is imported: a
    test or a script that imports the application starts no thread.
    """
    if not apps.ready:
        django.setup()
    # Imported here: they import models, which load with the apps (just above).
    from gateway.records import history, refusals, usage  # noqa: PLC0415
    from guard import records  # noqa: PLC0415

    records.start()
    # What the gateway served on this port (gateway.records.usage) and what its guard refused
    # (gateway.records.refusals), written in batches too.
    usage.start()
    history.start()
    refusals.start()
    # Imported here: importing llmgw_admin.asgi builds the application, once it is served.
    from llmgw_admin.asgi import gateway_assembly  # noqa: PLC0415

    # The gateway's traffic and its load report for scaling, from the start.
    if gateway_assembly.traffic is not None:
        gateway_assembly.traffic.start()


def _exit(signum: int, frame: Any) -> None:
    sys.exit(0)  # a stop that was asked for


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")

    parser = argparse.ArgumentParser(description="Serve llmgw's web process alone.")
    parser.add_argument("--bind", default=settings.LLMGW_BIND, help="default LLMGW_BIND")
    parser.add_argument("--port", type=int, default=settings.LLMGW_PORT, help="default LLMGW_PORT")
    args = parser.parse_args()
    run(args.bind, args.port)


if __name__ == "__main__":
    main()
