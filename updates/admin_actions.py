"""The admin's bulk actions on catalog models that belong to the updates app, registered
with the catalog's admin by ``UpdatesConfig.ready()`` (``catalog.extensions``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages

from catalog.choices import Surface
from llmgw_core.roles import OPERATOR
from updates import checking, flow, run


@admin.action(permissions=[OPERATOR], description="Check selected models for updates")
def check_for_updates(modeladmin: Any, request: Any, queryset: Any) -> None:
    """Check each selected model for updates now; say what each check found."""
    names = list(queryset.values_list("name", flat=True))
    results = checking.check_models(names, by=f"{request.user.get_username()} (admin)")
    for state, level in (("available", messages.WARNING), ("error", messages.ERROR)):
        found = [r for r in results if r.state == state]
        for r in found:
            modeladmin.message_user(request, f"{r.model}: {r.state}: {r.message}", level)
    current = [r.model for r in results if r.state == "current"]
    if current:
        modeladmin.message_user(request, f"Up to date: {', '.join(current)}.", messages.SUCCESS)


# The update flow (updates.run).
@admin.action(permissions=[OPERATOR], description="Update selected models to their newest weights")
def update_models(modeladmin: Any, request: Any, queryset: Any) -> None:
    """Start an update of each selected model (the newest revision, promoted by hand);
    say which started and why the others did not."""
    started = []
    for name in queryset.values_list("name", flat=True):
        try:
            r = run.start(name, user=request.user, surface=Surface.ADMIN, via="admin")
        except flow.FlowRefused as exc:
            modeladmin.message_user(request, f"{name}: {exc}", messages.ERROR)
        else:
            started.append(f"{name} (#{r.pk})")
    if started:
        modeladmin.message_user(
            request,
            f"Update started: {', '.join(started)}. The Updates page follows them.",
            messages.SUCCESS,
        )
