"""The tokens API: admins issue, list and revoke the tokens scripts use.

An admin issues tokens for itself only, a superuser for anyone (logged as such), and never
through a token; every token says who made it (``created_by``).
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response

from llmgw_core.api import shown_once
from llmgw_core.models import ApiToken, issue_problem
from llmgw_core.roles import ADMIN


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


class ApiTokenViewSet(
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

    @extend_schema(request=ApiTokenSerializer, responses={201: IssuedTokenSerializer})
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = ApiTokenSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
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
        token, secret = ApiToken.issue(
            data["user"], data["name"], data.get("expires"), by=request.user
        )
        return shown_once(dict(ApiTokenSerializer(token).data), "token", secret)

    @extend_schema(request=None, responses=ApiTokenSerializer)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        token = self.get_object()
        if token.revoked is None:
            token.revoked = timezone.now()
            token.save(update_fields=["revoked"])
        return Response(ApiTokenSerializer(token).data)
