"""``manage.py catalog update ...``: the updates app's group of the catalog command.

Registered with the catalog's command by ``UpdatesConfig.ready()`` (``catalog.extensions``:
the catalog does not import this app), with the admin's "Check for updates".

    manage.py catalog update check [MODEL ...] [--json]
    manage.py catalog update start|promote|rollback|status ...   (updates.cli: the flow's)

``check`` compares each model named (every model with a registry when none is) with its
registry's latest revision, file by file; it prints a line a model (``--json``: one JSON
object a line, ``{"model", "state", "revision", "latest", "changed", "added", "removed",
"message"}``) and exits 1 when any check is an ``error`` (a model not in the catalog, a
repository gone or unreachable: the others are checked, nothing changes).
"""

from __future__ import annotations

import getpass
import json
import socket
from typing import Any

from catalog import extensions
from updates import checking, cli
from updates.admin_actions import check_for_updates, update_models


def who() -> str:
    """Return who runs the command, as the check records it."""
    return f"{getpass.getuser()}@{socket.gethostname()} (command line)"


def add_arguments(parser: Any) -> None:
    """Add the ``update`` group's actions to its parser."""
    sub = parser.add_subparsers(dest="update_action", required=True)
    check = sub.add_parser(
        "check", help="check models for updates (all with a registry if none named)"
    )
    check.add_argument("models", nargs="*", metavar="MODEL")
    check.add_argument("--json", action="store_true", help="one JSON object a line")
    cli.add_arguments(sub)


def handle(command: Any, options: dict[str, Any]) -> None:
    """Run one action of the ``update`` group."""
    action = options["update_action"]
    if action == "check":
        _check(command, options)
        return

    code = cli.handle(action, options, command.stdout, command.stderr)
    if code:
        raise SystemExit(code)


def _check(command: Any, options: dict[str, Any]) -> None:
    results = checking.check_models(options["models"] or None, by=who())
    for r in results:
        if options["json"]:
            command.stdout.write(json.dumps(r.as_json()))
        else:
            command.stdout.write(f"{r.model}: {r.state}: {r.message}")
    if any(r.state == "error" for r in results):
        raise SystemExit(1)


def register() -> None:
    """Add the ``update`` group to the catalog command, and the admin's bulk action."""
    extensions.add_subcommand(
        extensions.Subcommand(
            "update",
            "check models for updates, and move them to new weights",
            add_arguments,
            handle,
        )
    )
    extensions.add_admin_action(check_for_updates)
    extensions.add_admin_action(update_models)
