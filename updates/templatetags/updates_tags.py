"""Template tags of the updates app: the catalog list's "update available" badges."""

from __future__ import annotations

from typing import Any

from django import template

from updates import live

register = template.Library()


@register.simple_tag
def update_states(names: list[str]) -> dict[str, Any]:
    """Each named model's last update check (updates.live.update_states, one query)."""
    return live.update_states(names)


@register.inclusion_tag("updates/partials/update_badge.html")
def update_badge(states: dict[str, Any], name: str) -> dict[str, Any]:
    """A model's update badge in the catalog list, as the live view pushes it."""
    return {"dom_id": live.badge_dom_id(name), "check": states.get(name), "name": name}
