"""The tokens API: admins issue, list and revoke the tokens scripts use.

An admin issues tokens for itself only, a superuser for anyone (logged as such), and never
through a token; every token says who made it (``created_by``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request

from llmgw_core.models import ApiToken, issue_problem
from llmgw_core.roles import ADMIN
from llmgw_core.shownonce import ShownOnceActions


class ApiTokenSerializer(serializers.ModelSerializer[ApiToken]):
    """A token as listed: never its secret."""

    user = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.all()
    )
    state = serializers.CharField(read_only=True)
    created_by = serializers.CharField(source="created_by_name", read_only=True)

    class Meta:
        model = ApiToken
        fields = (
            "id",
            "user",
            "created_by",
            "name",
            "prefix",
            "created",
            "expires",
            "revoked",
            "last_used",
            "state",
        )
        read_only_fields = ("prefix", "created", "revoked", "last_used")

    def validate_expires(self, value: Any) -> Any:
        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("expires is in the past: give a later time, or none")
        return value


class IssuedTokenSerializer(ApiTokenSerializer):
    """A token just issued: the only time its secret is shown."""

    token = serializers.CharField(read_only=True)

    class Meta(ApiTokenSerializer.Meta):
        fields = (*ApiTokenSerializer.Meta.fields, "token")


@extend_schema_view(
    create=extend_schema(request=ApiTokenSerializer, responses={201: IssuedTokenSerializer}),
    revoke=extend_schema(request=None, responses=ApiTokenSerializer),
)
class ApiTokenViewSet(
    ShownOnceActions,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    viewsets.GenericViewSet,  # type: ignore[type-arg]
):
    """API tokens: issued, listed and revoked by admins; the secret is shown once."""

    queryset = ApiToken.objects.select_related("user")
    serializer_class = ApiTokenSerializer
    read_role = ADMIN
    required_role = ADMIN

    def issue(self, request: Request, data: dict[str, Any]) -> tuple[ApiToken, str]:
        why = issue_problem(request.user, data["user"], isinstance(request.auth, ApiToken))
        if why:
            raise PermissionDenied(why)
        if ApiToken.objects.filter(
            user=data["user"], name=data["name"], revoked__isnull=True
        ).exists():
            raise serializers.ValidationError(
                {
                    "name": [
                        "this user already has a live token of that name: revoke it or pick another"
                    ]
                }
            )
        return ApiToken.issue(data["user"], data["name"], data.get("expires"), by=request.user)
