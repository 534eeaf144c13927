"""Where the layers above add to the catalog's own surfaces, which do not import them.

The catalog is below every app that acts on a model (the import direction,
docs/development.md), yet some of their actions belong on the catalog's surfaces: the
``catalog`` command's ``update`` group and the admin's "Check for updates" are the
updates app's. Such an app registers them here from its ``AppConfig.ready()``; the
catalog's command and admin read what is registered, knowing nothing of who did.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Subcommand:
    """A ``manage.py catalog <name> ...`` subcommand: its parser's arguments and its run.

    ``handle(command, options)`` runs it (``command`` is the ``BaseCommand``: write with
    ``command.stdout``; exit non-zero with ``SystemExit``).
    """

    name: str
    help: str
    add_arguments: Callable[[Any], None]
    handle: Callable[[Any, dict[str, Any]], None]


SUBCOMMANDS: dict[str, Subcommand] = {}
# Admin actions on catalog models, as ``@admin.action`` functions (modeladmin, request,
# queryset), each with its ``permissions``.
ADMIN_ACTIONS: list[Callable[..., Any]] = []


def add_subcommand(sub: Subcommand) -> None:
    """Register a subcommand of ``manage.py catalog`` (again by name: replaced)."""
    SUBCOMMANDS[sub.name] = sub


def add_admin_action(action: Callable[..., Any]) -> None:
    """Register an admin action on catalog models (once, however often asked)."""
    if action not in ADMIN_ACTIONS:
        ADMIN_ACTIONS.append(action)
