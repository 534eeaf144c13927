"""The cluster in the admin: nodes, read-only, with the operator's "release" action.

What a node reports is the agent's to set, so no field is edited here; an operator releases
a node (its token stops working, the next join under its name takes it) as on the console,
the API and the command line, logged with who did it.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from cluster import agentjoin, services, tenancy, wake
from cluster.models import Node, Quota
from llmgw_core.roles import OPERATOR, RoleAdminMixin


@admin.register(Node)
class NodeAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Nodes as their agents report them; released by an operator."""

    list_display = ("name", "state", "address", "allowed_address", "hostname", "last_heartbeat")
    list_filter = ("health", "cordoned", "simulated")
    search_fields = ("name", "hostname", "address")
    readonly_fields = tuple(
        f.name for f in Node._meta.get_fields() if getattr(f, "concrete", False) and f.name != "id"
    )
    actions = ("release",)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return False  # a node joins through its agent

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its fields are its agent's (the address: console, API, CLI)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # release it instead: what it runs is kept for the next join

    @admin.action(
        permissions=[OPERATOR], description="Release selected nodes (the next join takes each)"
    )
    def release(self, request: HttpRequest, queryset: QuerySet[Node]) -> None:
        names = []
        for node in queryset:
            agentjoin.release(node, request.user.get_username())
            services.log_action(
                request.user, "release", f"node {node.name}",
                "node token dropped; the next join takes it", "admin",
            )  # fmt: skip
            names.append(node.name)
        self.message_user(
            request,
            f"released {', '.join(names)}: each one's agent token no longer works, and the "
            "next agent to join under its name takes it",
            messages.SUCCESS,
        )


@admin.register(Quota)
class QuotaAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Capacity quotas per owner (``cluster.quotas``): checked by the model's ``clean``
    (the same check the console, the API and the command make), logged on each change."""

    list_display = ("owner", "parent", "cards", "cpu_cores", "tpm", "updated")
    search_fields = ("owner", "parent")
    fields = ("owner", "parent", "cards", "cpu_cores", "tpm")

    def save_model(self, request: HttpRequest, obj: Quota, form: Any, change: bool) -> None:
        super().save_model(request, obj, form, change)
        services.log_action(request.user, "quota set", obj.owner, tenancy.describe(obj), "admin")
        wake.reconcile_soon()

    def delete_model(self, request: HttpRequest, obj: Quota) -> None:
        services.log_action(request.user, "quota removed", obj.owner, "", "admin")
        super().delete_model(request, obj)
        wake.reconcile_soon()

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)  # one at a time, each logged
        return actions
