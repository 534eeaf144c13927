"""The console's hints for models that can run nowhere for want of an engine."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django import template

from cluster import hints

register = template.Library()


@register.simple_tag
def with_engine_hints(unplaced: Iterable[tuple[str, Any]]) -> list[tuple[str, Any, Any]]:
    """Return (model name, replica, hint) for the unplaced list, the hint on each model's
    first replica only (``cluster.hints``; one read for the whole list)."""
    rows = list(unplaced)
    found = hints.hints_for({name for name, _ in rows})
    out, seen = [], set()
    for name, r in rows:
        out.append((name, r, found.get(name) if name not in seen else None))
        seen.add(name)
    return out
