"""The updates app in the admin: the mirror's fetches and the update checks, read only
(the system writes them; a fetch is asked for by a node or an update, a check by the
schedule, the console, the API, the command or the catalog admin's bulk action)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from catalog.choices import Surface
from llmgw_core.roles import OPERATOR, RoleAdminMixin
from updates import flow, run
from updates.models import Fetch, UpdateCheck, UpdateRun


@admin.register(Fetch)
class FetchAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Fetches into the weights mirror, newest first."""

    list_display = ("model", "source", "commit", "state", "bytes_done", "bytes_total", "created")
    list_filter = ("state",)
    search_fields = ("model", "source", "commit")
    change_role = None


@admin.register(UpdateCheck)
class UpdateCheckAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Each model's last update check."""

    list_display = ("model", "state", "revision", "latest", "checked", "checked_by")
    list_filter = ("state",)
    search_fields = ("model",)
    change_role = None


# The update flow.
@admin.register(UpdateRun)
class UpdateRunAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Every update of a model, newest first; promoted or cancelled in bulk by operators."""

    list_display = ("model", "state", "step", "commit", "score", "started_by", "surface", "created")
    list_filter = ("state", "step", "surface")
    search_fields = ("model", "candidate", "commit", "started_by")
    change_role = None
    actions = ("promote_updates", "cancel_updates")

    @admin.action(permissions=[OPERATOR], description="Promote selected updates now")
    def promote_updates(self, request: HttpRequest, queryset: Any) -> None:
        """Promote each selected update that is running; say why not for the others."""
        self._each(request, queryset, run.promote, "promoted")

    @admin.action(permissions=[OPERATOR], description="Cancel selected updates")
    def cancel_updates(self, request: HttpRequest, queryset: Any) -> None:
        """End each selected running update; its candidate goes, its model stays."""
        self._each(request, queryset, run.cancel, "cancelled")

    def _each(self, request: HttpRequest, queryset: Any, act: Any, done: str) -> None:
        names = sorted(set(queryset.values_list("model", flat=True)))
        ok = []
        for name in names:
            try:
                act(name, user=request.user, surface=Surface.ADMIN, via="admin")
            except flow.FlowRefused as exc:
                self.message_user(request, f"{name}: {exc}", messages.ERROR)
            else:
                ok.append(name)
        if ok:
            self.message_user(request, f"{done.capitalize()}: {', '.join(ok)}.", messages.SUCCESS)
