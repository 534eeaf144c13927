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
        from daphne.cli import CommandLineInterface

        CommandLineInterface().run(
            [
                "--bind", options["bind"], "--port", str(options["port"]),
                "--verbosity", "1", "llmgw_admin.asgi:application",
            ]
        )  # fmt: skip
