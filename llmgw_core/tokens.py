"""Token authentication for scripts: ``Authorization: Bearer llmgw_…``."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from llmgw_core.models import TOKEN_PREFIX, ApiToken, digest


class TokenAuthentication(authentication.BaseAuthentication):
    """Authenticate a request by an API token, refusing revoked and expired ones."""

    keywords = ("bearer", "token")

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        parts = header.split()
        if not parts or parts[0].lower() not in self.keywords:
            return None
        if len(parts) != 2 or not parts[1].startswith(TOKEN_PREFIX):
            raise exceptions.AuthenticationFailed(
                "write the header as: Authorization: Bearer llmgw_..."
            )
        token = ApiToken.objects.select_related("user").filter(digest=digest(parts[1])).first()
        if token is None:
            raise exceptions.AuthenticationFailed("unknown API token")
        if token.state != "live":
            raise exceptions.AuthenticationFailed(f"this API token is {token.state}")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("this token's user is disabled")
        now = timezone.now()
        # Written at most once a minute: a script calling in a loop must not turn every
        # read into a write.
        if token.last_used is None or (now - token.last_used).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used=now)
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="api"'


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """Describe token authentication in the OpenAPI schema as a bearer scheme."""

    target_class = "llmgw_core.tokens.TokenAuthentication"
    name = "apiToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "bearerFormat": "llmgw_…"}
