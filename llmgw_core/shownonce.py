"""The API of a secret shown once: API tokens and join tokens (the gateway's client keys
answer the same way, through ``llmgw_core.api.shown_once``).

Apart from ``llmgw_core.api``, which DRF's settings import while ``rest_framework.views``
is still loading: this module imports DRF's decorators, which import those views.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from llmgw_core.api import shown_once
from llmgw_core.models import revoke


class ShownOnceActions:
    """``create`` and ``revoke`` for a viewset of secrets shown once (API tokens, join
    tokens): create checks the body with the viewset's serializer, makes the secret with
    ``issue`` and answers it once (``shown_once``, under ``secret_field``); revoke marks it
    revoked (``llmgw_core.models.revoke``) and calls ``revoked`` the first time, for a log
    line. Put before DRF's mixins and ``GenericViewSet``."""

    secret_field = "token"

    def issue(self, request: Request, data: dict[str, Any]) -> tuple[Any, str]:
        """Make the secret from the checked body; return the row and the secret."""
        raise NotImplementedError

    def revoked(self, request: Request, row: Any) -> None:
        """Called once a row is revoked (not when it already was)."""

    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = self.get_serializer(data=request.data)  # type: ignore[attr-defined]
        serializer.is_valid(raise_exception=True)
        row, secret = self.issue(request, serializer.validated_data)
        listed = dict(self.get_serializer(row).data)  # type: ignore[attr-defined]
        return shown_once(listed, self.secret_field, secret)

    @extend_schema(request=None)
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str) -> Response:
        """Revoke it: it stops working at once; the row stays, marked revoked."""
        row = self.get_object()  # type: ignore[attr-defined]
        if revoke(row):
            self.revoked(request, row)
        return Response(self.get_serializer(row).data)  # type: ignore[attr-defined]
