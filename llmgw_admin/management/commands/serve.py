"""Serve the ASGI application (console, API, admin, websockets) with Daphne."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Serve llmgw's web process (HTTP and websockets) on one address."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--bind", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)

    def handle(self, *args: Any, **options: Any) -> None:
        import threading

        from daphne.cli import CommandLineInterface
        from django.conf import settings

        from cluster import reconciler

        if not settings.REDIS_URL:
            # Embedded: no worker or beat, so the periodic work runs in this process.
            interval = float(settings.LLMGW_RECONCILE_INTERVAL)
            threading.Thread(
                target=reconciler.run_forever, args=(interval,), name="reconciler", daemon=True
            ).start()
            self.stdout.write(f"reconciling in-process every {interval:g} s")

        CommandLineInterface().run(
            [
                "--bind", options["bind"], "--port", str(options["port"]),
                "--verbosity", "1", "llmgw_admin.asgi:application",
            ]
        )  # fmt: skip
