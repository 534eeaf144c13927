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


class RoleAdminMixin:
    """Admin rights from the user's role: viewers read, those holding ``change_role``
    (operator unless set) add, change and delete.

    Every app's ``ModelAdmin`` and inline puts it first among its bases. An admin action
    or view asks for its role through these methods (an action's
    ``allowed_permissions = ("change",)`` asks ``has_change_permission``), so a role
    means the same in the admin as on the pages and the API.
    """

    change_role = OPERATOR

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_role(request.user, VIEWER)

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return has_role(request.user, self.change_role)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_role(request.user, self.change_role)

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return has_role(request.user, self.change_role)

    def has_module_permission(self, request: HttpRequest) -> bool:
        return has_role(request.user, VIEWER)
