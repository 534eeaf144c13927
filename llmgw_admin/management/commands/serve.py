"""Serve the ASGI application (console, API, admin, websockets): ``llmgw_admin.server``.

Embedded (no ``LLMGW_REDIS_URL``): the periodic jobs (``llmgw_admin.jobs``: the reconciler,
the judges' probe) run in this process, other processes' live events and wake-ups arrive
through ``cluster.relay``, and, unless ``LLMGW_LOCAL_AGENT`` is false, a node agent for this
machine runs beside it, so a model with a CPU profile (llama.cpp) runs here with nothing
else installed.

When ``LLMGW_SIMULATE`` names simulated nodes (the embedded default does), an agent for
each runs in a thread of this process (``llmgw_admin.demo.start_agents``).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from cluster import agentjoin, relay
from cluster.models import JoinToken
from gateway.server import AddressRefused, listen
from guard import evalrun
from llmgw_admin import demo, jobs, server
from llmgw_core.workers import cores


class Command(BaseCommand):
    help = "Serve llmgw's web process (HTTP and websockets) on one address."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--bind", default=None, help="default LLMGW_BIND (127.0.0.1)")
        parser.add_argument("--port", type=int, default=None, help="default LLMGW_PORT (8000)")
        parser.add_argument("--workers", type=int, default=None,
                            help="processes serving the port (SO_REUSEPORT), restarted when "
                            "one dies; more than 1 only with LLMGW_REDIS_URL; 0: one a core; "
                            "default LLMGW_WEB_WORKERS (1)")  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        # Its notes reach a log file or a pipe as they are written, not when it exits.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(line_buffering=True)

        if options["bind"] is None:
            options["bind"] = settings.LLMGW_BIND
        if options["port"] is None:
            options["port"] = settings.LLMGW_PORT
        count = settings.LLMGW_WEB_WORKERS if options["workers"] is None else options["workers"]
        if count < 0:
            raise CommandError(f"--workers {count}: 1 or more, or 0 for one a core "
                               f"({cores()} here)")  # fmt: skip
        count = count or cores()
        if count > 1 and not settings.REDIS_URL:
            raise CommandError(
                f"--workers {count}: the embedded web process (no LLMGW_REDIS_URL) is one "
                "process: its reconciler, its consoles' live changes and its local agent are "
                "its own. Set LLMGW_REDIS_URL (with a Celery worker and beat) to serve with "
                "several, or write --workers 1"
            )
        if count > 1 and settings.LLMGW_SIMULATE:
            raise CommandError(
                f"--workers {count}: LLMGW_SIMULATE runs its simulated nodes' agents inside "
                "the web process, one set per process: write --workers 1, or LLMGW_SIMULATE=off"
            )

        # The address is checked before anything starts, as the gateway process checks
        # its own: a port out of range, an address not this machine's, one in use.
        try:
            sock = listen(options["bind"], options["port"], shared=count > 1)
        except AddressRefused as error:
            raise CommandError(str(error)) from None
        if count > 1:
            connections.close_all()  # each worker opens its own
            raise SystemExit(server.run_workers(sock, count, self._say, self._warn))
        sock.close()

        if not settings.REDIS_URL:
            # Embedded, the consoles' channel layer is in this process's memory: other
            # processes (a command in a terminal) hand their changes to it here.
            if relay.listen(settings.DATA_DIR):
                self.stdout.write("live changes from other processes heard on live.sock")

            # Embedded, evaluations are asked by threads of this process: any still
            # running was being asked by one that stopped.
            if evalrun.abandon_running("the web process asking it stopped: start it again"):
                self.stdout.write("evaluations left running by the last stop marked failed")
            # Embedded: no worker or beat, so the periodic jobs run in this process, from
            # the table beat's schedule is built from.
            if not settings.GATEWAY_URL_GIVEN:
                # The jobs that send requests through the gateway (a batch's lines, the
                # eval gate) send them to this process.
                host = options["bind"] if options["bind"] not in ("0.0.0.0", "::", "") \
                    else "127.0.0.1"  # fmt: skip
                host = f"[{host}]" if ":" in host else host
                settings.LLMGW_GATEWAY_URL = f"http://{host}:{options['port']}"
            jobs.start_embedded(settings)
            self.stdout.write(
                f"reconciling in-process every {float(settings.LLMGW_RECONCILE_INTERVAL):g} s"
            )
            if settings.LLMGW_LOCAL_AGENT:
                self._start_local_agent(options["bind"], options["port"], Path(settings.DATA_DIR))
        if settings.LLMGW_SIMULATE:
            self._start_simulated(options["bind"], options["port"], Path(settings.DATA_DIR))

        server.run(options["bind"], options["port"])

    def _say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def _warn(self, line: str) -> None:
        self.stderr.write(line, style_func=self.style.WARNING)
        self.stderr.flush()

    def _start_local_agent(self, bind: str, port: int, data_dir: Path) -> None:
        """Start this machine's agent, joined with a one-use token made for it."""
        state = data_dir / "agent"
        env = dict(os.environ)
        if not (state / "node_token").exists():
            _, secret = JoinToken.issue("local agent", max_uses=1)
            env["LLMGW_JOIN_TOKEN"] = secret
            # Its state folder was removed: the node of that name is this one's to take.
            agentjoin.reclaim(socket.gethostname(), "serve (local agent)")
        host = "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind
        log = (data_dir / "agent.log").open("ab")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "agent", "--server", f"http://{host}:{port}",
                "--name", socket.gethostname(), "--state-dir", str(state),
                # One command started everything, so Ctrl-C stops everything.
                "--stop-engines-on-exit",
            ],
            cwd=Path(__file__).resolve().parents[3], env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        atexit.register(_stop, proc)
        self.stdout.write(f"local agent started (log: {log.name})")

    def _start_simulated(self, bind: str, port: int, data_dir: Path) -> None:
        """Start the simulated nodes' agents (``LLMGW_SIMULATE``) in this process."""
        host = "127.0.0.1" if bind in ("0.0.0.0", "::", "") else bind
        names = demo.start_agents(settings.LLMGW_SIMULATE, host, port, data_dir)
        self.stdout.write(
            f"simulated nodes {', '.join(names)} started (LLMGW_SIMULATE=off for none; "
            f"log: {data_dir / 'simulated.log'})"
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
