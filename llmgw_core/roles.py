"""The three roles: viewer (reads), operator (changes the catalog and cluster), admin.

A role is a Django group of that name; a superuser is an admin. Pages, the API, the
websocket and the admin all ask ``has_role``, so a role means the same thing everywhere:
``role_required`` for console views, ``RolePermission`` for the API, ``RoleAdminMixin``
for every app's admin.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.core import checks
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from rest_framework.permissions import SAFE_METHODS, BasePermission

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)
RANK = {VIEWER: 1, OPERATOR: 2, ADMIN: 3}


def role_of(user: Any) -> str | None:
    """Return the user's highest role, or None for no role (or no user)."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        return ADMIN
    cached = getattr(user, "_llmgw_role", "unset")
    if cached != "unset":
        return cached  # type: ignore[no-any-return]
    names = set(user.groups.values_list("name", flat=True))
    role = next((r for r in reversed(ROLES) if r in names), None)
    user._llmgw_role = role
    return role


def has_role(user: Any, needed: str) -> bool:
    """Return whether the user holds ``needed`` or a higher role."""
    role = role_of(user)
    return role is not None and RANK[role] >= RANK[needed]


def role_required(
    needed: str,
) -> Callable[[Callable[..., HttpResponse]], Callable[..., HttpResponse]]:
    """Guard a console view: sign in first, then hold ``needed`` (403 otherwise)."""

    def decorate(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not has_role(request.user, needed):
                raise PermissionDenied(f"this needs the {needed} role")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


class RolePermission(BasePermission):
    """Let viewers read and operators write; a view may ask for more with ``required_role``.

    ``required_role`` on a view is the role for its unsafe methods;
    ``read_role`` the role for reading (viewer unless set).
    """

    message = "this needs a role you do not hold"

    def has_permission(self, request: Any, view: Any) -> bool:
        if request.method in SAFE_METHODS:
            needed = getattr(view, "read_role", VIEWER)
        else:
            needed = getattr(view, "required_role", OPERATOR)
        if not has_role(request.user, needed):
            self.message = f"this needs the {needed} role"
            return False
        return True


def role_context(request: HttpRequest) -> dict[str, Any]:
    """Give templates the user's role and what it allows."""
    user = getattr(request, "user", None)
    return {
        "role": role_of(user),
        "can_edit": has_role(user, OPERATOR),
        "is_admin_role": has_role(user, ADMIN),
    }


# What an admin action's ``permissions`` may name: a role, or one of Django's four, which
# the mixin answers from the role too (``change`` is the admin's ``change_role``).
ACTION_PERMISSIONS = (*ROLES, "view", "add", "change", "delete")


class RoleAdminMixin:
    """Admin rights from the user's role: viewers read, those holding ``change_role``
    (operator unless set) add, change and delete. ``change_role = None`` is a read-only
    admin: rows the system writes itself (logs, records), never added, changed or
    deleted there.

    Every app's ``ModelAdmin`` and inline puts it first among its bases (a test walks
    ``admin.site``'s registry). Every admin view asks these methods. Every admin action
    names the role it needs, ``@admin.action(permissions=[OPERATOR])`` (or ``["delete"]``,
    ...): Django offers and runs an action only to users its ``has_<name>_permission``
    lets through, and runs none it does not offer. An action that names no role is
    offered to nobody, and ``manage.py check`` reports it (``llmgw.E001``); a posted
    action the user's role does not allow is answered 403.
    """

    change_role: str | None = OPERATOR

    def _may_change(self, request: HttpRequest) -> bool:
        return self.change_role is not None and has_role(request.user, self.change_role)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_role(request.user, VIEWER)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return self._may_change(request)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_change(request)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_change(request)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, VIEWER)

    # The roles, as action permissions: @admin.action(permissions=[OPERATOR]).

    def has_viewer_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, VIEWER)

    def has_operator_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, OPERATOR)

    def has_admin_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, ADMIN)

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        """Return the actions the user's role allows; an action naming no role is none's."""
        actions = super().get_actions(request)  # type: ignore[misc]
        return {
            name: action for name, action in actions.items() if _action_problem(action[0]) is None
        }

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        """Answer 403 to a posted action the user's role does not allow (Django would
        show the list again, saying only "No action selected")."""
        name = request.POST.get("action") if request.method == "POST" else None
        if name and name not in self.get_actions(request):
            known = {n: f for f, n, _ in self._get_base_actions()}  # type: ignore[attr-defined]
            if name in known:
                needs = ", ".join(getattr(known[name], "allowed_permissions", ()) or ["a role"])
                raise PermissionDenied(f"the action {name} needs {needs}: your role does not")
        return super().changelist_view(request, extra_context)  # type: ignore[misc, no-any-return]

    def check(self, **kwargs: Any) -> list[Any]:
        """Django's checks, and that every action names a role (``llmgw.E001``)."""

        errors = list(super().check(**kwargs))  # type: ignore[misc]
        if hasattr(self, "_get_base_actions"):
            for func, name, _ in self._get_base_actions():
                problem = _action_problem(func)
                if problem:
                    errors.append(
                        checks.Error(
                            f"the admin action {name!r} {problem}",
                            hint="decorate it with @admin.action(permissions=[OPERATOR]) "
                            "(a role from llmgw_core.roles, or view, add, change or delete)",
                            obj=type(self),
                            id="llmgw.E001",
                        )
                    )
        return errors


def _action_problem(func: Any) -> str | None:
    """Return what is wrong with an admin action's role, or None."""
    wanted = getattr(func, "allowed_permissions", None)
    if not wanted:
        return "names no role"
    unknown = [p for p in wanted if p not in ACTION_PERMISSIONS]
    if unknown:
        return f"names {', '.join(map(str, unknown))}, which is no role"
    return None
