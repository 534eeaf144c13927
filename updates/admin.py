"""The updates app in the admin: the mirror's fetches and the update checks, read only
(the system writes them; a fetch is asked for by a node or an update, a check by the
schedule, the console, the API, the command or the catalog admin's bulk action)."""

from __future__ import annotations

from django.contrib import admin

from llmgw_admin.roles import RoleAdminMixin
from updates.models import Fetch, UpdateCheck


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
