"""Template filters of the guard's pages."""

from __future__ import annotations

from pathlib import PurePath

from django import template

from guard import evaluation as ev
from guard.evalrun import SET_DIR

register = template.Library()


@register.filter
def percent(share: float | None) -> str:
    """Return a share as a percentage with one decimal (``12.5%``), ``—`` for none."""
    return ev.percent(share)


@register.filter
def score(value: float | None) -> str:
    """Return an unsafe score with two decimals, ``—`` for none."""
    return "—" if value is None else f"{value:.2f}"


@register.filter
def set_shown(source: str) -> str:
    """Where an evaluation's set came from, without the machine's paths: a packaged set
    by name, a file by its name alone."""
    path = PurePath(source)
    if path.parent == PurePath(SET_DIR) and path.suffix == ".yaml":
        return f"the packaged set {path.stem}"
    return path.name or source
