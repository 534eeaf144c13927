"""The console's hint for a model that can run nowhere for want of an engine."""

from __future__ import annotations

from django import template

register = template.Library()


@register.inclusion_tag("cluster/partials/engine_hint.html")
def engine_hint(name: str) -> dict:
    """What the model needs and how to get it (``cluster.hints``); nothing if it can run."""
    from cluster import hints

    return {"hint": hints.hint_for(name)}
