"""A judge's hint when it can run nowhere: what it needs, and who answers meanwhile."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("cluster/partials/engine_hint.html")
def judge_hint(row: Any) -> dict:
    """The engine hint of a judge's row (``guard.live.JudgeHealthRow``: read for every
    row at once, ``cluster.hints``), with who answers meanwhile."""
    if row.hint is None:
        return {"hint": None}
    return {"hint": row.hint, "meanwhile": row.meanwhile}
