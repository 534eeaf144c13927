"""The gateway in the admin.

Client keys: read-only (the secret is never stored; only its prefix and digest are; the
digest is shown to no one, since it is what a stolen table would be searched against), with
a revoke action for operators. Keys are made in the console,
the API or ``manage.py gateway key create``, which show the secret once.

Usage and the guard's refusal records: read-only, as every gateway process writes them
(``gateway.records.usage``, ``gateway.records.refusals``); refusal records go by age alone
(``LLMGW_GATEWAY_REFUSAL_DAYS``).

Federated peers: operators add (checked as ``federation add`` checks) and delete (its
models leave the catalog with it), through ``gateway.peers``, logged with who did it;
viewers see each peer's state, last error and models.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from gateway import keys, peers
from gateway.models import ClientKey, Peer, Refusal, Usage
from llmgw_core.roles import OPERATOR, RoleAdminMixin


@admin.register(ClientKey)
class ClientKeyAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ("name", "state", "owner", "models_shown", "priority", "rpm", "tpm", "expires",
                    "prefix_shown", "created", "revoked")  # fmt: skip
    list_filter = ("owner",)
    search_fields = ("name", "owner")
    readonly_fields = ("name", "owner", "models", "priority", "rpm", "tpm", "prefix_shown",
                       "created", "created_by", "expires", "revoked")  # fmt: skip
    fields = readonly_fields
    actions = ("revoke_selected",)
    # Made where the secret can be shown once (console, API, command); revoked, never
    # deleted: the row says who had access. Revoking is the one change, an action.
    change_role = None

    @admin.display(description="models")
    def models_shown(self, obj: ClientKey) -> str:
        return ", ".join(obj.models) or "every cluster model"

    @admin.display(description="prefix")
    def prefix_shown(self, obj: ClientKey) -> str:
        return f"llmgw-ck-{obj.prefix}…"

    @admin.action(permissions=[OPERATOR], description="Revoke selected client keys")
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[ClientKey]) -> None:
        done = [k.name for k in queryset if keys.revoke(k, user=request.user, via="admin")]
        if done:
            self.message_user(request, f"Revoked {len(done)} client key"
                              f"{'s' if len(done) != 1 else ''}: {', '.join(done)}.",
                              messages.SUCCESS)  # fmt: skip
        else:
            self.message_user(request, "The selected keys were already revoked.", messages.INFO)


@admin.register(Usage)
class UsageAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """What the gateway served, per minute, key, owner and model."""

    change_role = None
    list_display = ("minute", "key", "owner", "model", "requests", "errors", "tokens_in",
                    "tokens_out", "tokens_cached", "refusals", "batch_requests")  # fmt: skip
    list_filter = ("owner",)
    search_fields = ("key", "model")
    date_hierarchy = "minute"
    readonly_fields = list_display
    fields = list_display


@admin.register(Refusal)
class RefusalAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """A request or answer the guard refused, by the request id its client got."""

    change_role = None
    list_display = ("at", "request_id", "direction", "model", "key", "owner", "judge",
                    "verdict", "categories_shown", "score", "judged")  # fmt: skip
    list_filter = ("direction", "judged")
    search_fields = ("=request_id", "key", "model", "judge")
    date_hierarchy = "at"
    readonly_fields = ("at", "request_id", "direction", "model", "key", "owner", "judge",
                       "verdict", "categories", "score", "judged", "failures")  # fmt: skip
    fields = readonly_fields

    @admin.display(description="categories")
    def categories_shown(self, obj: Refusal) -> str:
        return ", ".join(obj.categories) or "—"


class PeerForm(forms.ModelForm):  # type: ignore[type-arg]
    class Meta:
        model = Peer
        fields = ("name", "url", "api_key_file")

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.instance.pk is None:
            found = peers.problems(
                data.get("name", ""), data.get("url", ""), data.get("api_key_file", "")
            )
            for field, messages_ in found.items():
                self.add_error(
                    "api_key_file" if field == "key_file" else (field or None), messages_
                )
        return data

    def validate_unique(self) -> None:
        """The name's uniqueness is ``peers.problems``' to say, in its words."""


@admin.register(Peer)
class PeerAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """A federated llmgw cluster: added and removed here, its state read-only."""

    form = PeerForm
    list_display = ("name", "url", "state", "last_error", "models_shown", "refreshed")
    search_fields = ("name", "url")
    readonly_fields = ("state", "last_error", "models_shown", "refreshed", "created", "created_by")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is not None:  # a peer is removed and added again, never edited
            return ("name", "url", "api_key_file", *self.readonly_fields)
        return ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return ("name", "url", "api_key_file")
        return ("name", "url", "api_key_file", *self.readonly_fields)

    @admin.display(description="models")
    def models_shown(self, obj: Peer) -> str:
        return ", ".join(f"{obj.name}/{m}" for m in obj.listed or []) or "-"

    def save_model(self, request: HttpRequest, obj: Peer, form: Any, change: bool) -> None:
        if change:
            return
        made = peers.add_peer(obj.name, obj.url, obj.api_key_file, user=request.user, via="admin")
        obj.pk = made.pk

    def delete_model(self, request: HttpRequest, obj: Peer) -> None:
        self._remove(request, obj.name)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Peer]) -> None:
        for peer in list(queryset):
            self._remove(request, peer.name)

    def _remove(self, request: HttpRequest, name: str) -> None:
        try:
            peers.remove_peer(name, user=request.user, via="admin")
        except peers.PeerRefused as refused:
            self.message_user(request, str(refused), messages.ERROR)
