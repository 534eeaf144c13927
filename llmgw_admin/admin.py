"""Users and API tokens in the admin: managed by the admin role only."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.auth.admin import GroupAdmin, UserAdmin
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.http import HttpRequest
from django.utils import timezone

from llmgw_admin.throttle import AdminLoginForm
from llmgw_core.models import ApiToken, issue_problem
from llmgw_core.roles import ADMIN, RoleAdminMixin, has_role


class AdminRoleMixin(RoleAdminMixin):
    """Only the admin role reads or changes these."""

    change_role = ADMIN

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_role(request.user, ADMIN)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, ADMIN)


# The admin's sign-in is throttled as the console's is (llmgw_admin/throttle.py).
admin.site.login_form = AdminLoginForm

admin.site.unregister(User)
admin.site.unregister(Group)


@admin.register(User)
class LlmgwUserAdmin(AdminRoleMixin, UserAdmin):  # type: ignore[type-arg]
    """Users; their role is the group they are in (viewer, operator or admin).

    Superuser status and per-user permissions go around the roles: only a superuser may
    grant them (an admin-role user could otherwise make itself, or anyone, a superuser on
    its own change page).
    """

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        fields = list(super().get_readonly_fields(request, obj))
        if not request.user.is_superuser:
            fields += ["is_superuser", "user_permissions"]
        return fields


@admin.register(Group)
class LlmgwGroupAdmin(AdminRoleMixin, GroupAdmin):  # type: ignore[type-arg]
    """The role groups."""


@admin.register(ApiToken)
class ApiTokenAdmin(AdminRoleMixin, admin.ModelAdmin):  # type: ignore[type-arg]
    """API tokens: issued here or by the API; the secret is shown once, on issue."""

    list_display = (
        "name", "user", "created_by_name", "prefix", "created", "expires", "revoked", "last_used"
    )  # fmt: skip
    list_filter = ("revoked",)
    search_fields = ("name", "user__username", "prefix")
    fields = ("user", "name", "expires")
    actions = ("revoke",)

    def get_form(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        form = super().get_form(request, obj, **kwargs)

        class Checked(form):  # type: ignore[misc,valid-type]
            def clean_user(self) -> Any:
                user = self.cleaned_data["user"]
                if why := issue_problem(request.user, user):
                    raise ValidationError(why)
                return user

        return Checked

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if change:
            obj.save()
            return
        token, secret = ApiToken.issue(obj.user, obj.name, obj.expires, by=request.user)
        obj.pk = token.pk
        messages.warning(request, f"Token issued; copy it now, it is not shown again: {secret}")

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # A token's secret cannot be changed; revoke it and issue another.
        return obj is None and super().has_change_permission(request, obj)

    @admin.action(permissions=[ADMIN], description="Revoke selected tokens")
    def revoke(self, request: HttpRequest, queryset: Any) -> None:
        n = queryset.filter(revoked__isnull=True).update(revoked=timezone.now())
        self.message_user(request, f"{n} token(s) revoked")
