"""The updates app's live fragments: each model's "update available" badge in the catalog
list, pushed by the live view (``llmgw_admin.consumer``) when a model is marked changed
(an update check or a fetch marks it: ``events.changed(models=[name])``), and rendered the
same way in the list's first render (``updates_tags``)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from typing import Any

from django.template.loader import render_to_string
from django.urls import reverse

from updates.models import UpdateCheck


def badge_dom_id(name: str) -> str:
    """Return the stable DOM id of a model's update badge: readable, unique per name."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]
    return f"update-badge-{slug}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def update_states(names: Iterable[str]) -> dict[str, UpdateCheck]:
    """Return the last check of each named model that has one (one query)."""
    return {c.model: c for c in UpdateCheck.objects.filter(model__in=list(names))}


def render_badge(name: str, check: UpdateCheck | None) -> str:
    """Return a model's badge: "update available", "check failed", or an empty holder."""
    return render_to_string(
        "updates/partials/update_badge.html",
        {"dom_id": badge_dom_id(name), "check": check, "name": name},
    )


def panel_pokes(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """Return, by name, what tells a model's page to ask for its updates panel at once (a
    fetch moved, a check ended): an element swapped into the panel's holder that asks for
    the panel when htmx loads it. The page asks with its own session, so the panel is the
    user's (an operator's buttons, the update flow's lines), as its own refresh shows it."""
    return {
        name: render_to_string(
            "updates/partials/panel_poke.html",
            {"url": reverse("updates:model_panel", args=[name])},
        )
        for name in names
    }


def badges_changed(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """Return each named model's badge, by name (the catalog list's live view)."""
    states = update_states(names)
    return {n: render_badge(n, states.get(n)) for n in names}
