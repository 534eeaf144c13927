"""The guard in Django's admin: the policy (the console's form and checks), its log, evaluations.

Saving the policy goes through ``guard.services.set_policy``, as the console, the API and
``guard policy set`` do: checked by ``guard.policy.validate`` and logged with who.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from catalog.choices import Surface
from guard import services
from guard.forms import PolicyForm
from guard.models import EvalRun, GuardPolicy, JudgeHealth, PolicyChange
from llmgw_core.roles import RoleAdminMixin


class GuardPolicyAdminForm(PolicyForm, forms.ModelForm):  # type: ignore[misc]
    """The policy form over the stored row: the console's fields and checks."""

    class Meta:
        model = GuardPolicy
        fields: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("policy", services.current_policy())
        super().__init__(*args, **kwargs)


@admin.register(GuardPolicy)
class GuardPolicyAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """The one policy in force."""

    form = GuardPolicyAdminForm
    list_display = ("__str__", "updated")
    fields = ("judge_models", "controversial", "fail", "directions", "categories")

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        # One policy: added by init or the first save; after that it is changed.
        return super().has_add_permission(request) and not GuardPolicy.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Deleting would put the baseline back unlogged: change it instead.
        return False

    def save_model(self, request: HttpRequest, obj: GuardPolicy, form: Any, change: bool) -> None:
        try:
            services.set_policy(form.policy_data, user=request.user, surface=Surface.ADMIN)
        except services.PolicyRefused as exc:  # checked in the form; a race lands here
            raise forms.ValidationError(str(exc)) from exc
        for note in form.notes:
            self.message_user(request, f"categories: {note}")
        row = GuardPolicy.objects.order_by("pk").first()
        if row is not None:
            obj.pk, obj.data, obj.updated = row.pk, row.data, row.updated


@admin.register(PolicyChange)
class PolicyChangeAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Who changed the policy, when, from where, and what."""

    change_role = None
    list_display = ("at", "actor_name", "surface", "summary")
    list_filter = ("surface",)


@admin.register(JudgeHealth)
class JudgeHealthAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Each judge's answers and failures."""

    change_role = None
    list_display = ("judge", "answers", "failures", "last_error_kind", "last_good_at")


@admin.register(EvalRun)
class EvalRunAdmin(RoleAdminMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """Evaluations of judges on labelled sets (the console's pages show their figures)."""

    change_role = None
    list_display = ("pk", "started", "set_name", "texts", "status", "actor_name")
    list_filter = ("status", "set_name")
