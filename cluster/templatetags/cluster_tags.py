"""Template filters of the cluster's console fragments."""

from __future__ import annotations

from django import template

from cluster import live, marks

register = template.Library()


@register.filter
def mb(value: int | float | None) -> str:
    """Show a size given in MB (MiB) as GB or MB: 81920 → "80 GB", 512 → "512 MB"."""
    if not value:
        return "0 MB"
    value = float(value)
    if value >= 1024:
        gb = value / 1024
        return f"{gb:.0f} GB" if gb >= 10 or gb.is_integer() else f"{gb:.1f} GB"
    return f"{value:.0f} MB"


@register.inclusion_tag("cluster/partials/model_live.html", takes_context=True)
def live_model(context: dict, name: str) -> dict:
    """A model's replicas as the live console shows them, kept current over the socket."""
    return {
        "m": live.model_row(name),
        "dom_id": live.model_dom_id(name),
        "name": name,
        "can_act": context.get("can_edit", False),
    }


@register.inclusion_tag("cluster/partials/reconciler.html")
def reconciler_status() -> dict:
    """The reconciler's last tick, its age and process, polled by the page (cluster.marks)."""
    return {"tick": marks.tick_status()}


@register.simple_tag
def readiness(names: list[str]) -> dict:
    """Each named model's ready replicas of those wanted (cluster.live.readiness, one query)."""
    return live.readiness(names)


@register.inclusion_tag("cluster/partials/ready.html")
def ready_cell(counts: dict, name: str) -> dict:
    """A model's ready cell in the catalog list, as the live view pushes it."""
    return {"r": counts.get(name) or live.Readiness(name, 0, 0)}
