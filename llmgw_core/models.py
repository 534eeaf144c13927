"""API tokens for scripts, stored hashed."""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

TOKEN_PREFIX = "llmgw_"


def digest(secret: str) -> str:
    """Return the stored form of a token: its SHA-256, hex.

    A plain hash suffices (no salt or stretching): tokens are 32 random bytes, so there is
    no dictionary to try, and checking one must stay cheap on every API call.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


class ShownOnce(models.Model):
    """A secret shown once, when it is made, and kept as its hash (``digest``): what API
    tokens and the gateway's client keys share. Live until it expires or is revoked."""

    prefix = models.CharField(max_length=12, editable=False)
    digest = models.CharField(max_length=64, unique=True, editable=False)
    created = models.DateTimeField(auto_now_add=True)
    expires = models.DateTimeField(null=True, blank=True)
    revoked = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @property
    def state(self) -> str:
        """Return live, expired or revoked."""
        if self.revoked:
            return "revoked"
        if self.expires and self.expires <= timezone.now():
            return "expired"
        return "live"


class ApiToken(ShownOnce):
    """A named token a script uses to call the API as a user; shown once, kept hashed."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(_("name"), max_length=100)
    prefix = models.CharField(max_length=12, db_index=True, editable=False)
    last_used = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ("-created",)
        verbose_name = _("API token")
        # Made by llmgw_admin before the framework had a package of its own: the table and
        # its constraint keep their names (llmgw_core's migration 0001 moved the state only).
        db_table = "llmgw_admin_apitoken"
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=models.Q(revoked__isnull=True),
                name="llmgw_admin_apitoken_unique_live_name",
                violation_error_message=_("this user already has a live token of that name"),
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.user})"

    @classmethod
    def issue(
        cls, user: object, name: str, expires: datetime | None = None
    ) -> tuple[ApiToken, str]:
        """Create a token and return it with its secret, which is never stored."""
        body = secrets.token_urlsafe(32)
        secret = f"{TOKEN_PREFIX}{body}"
        token = cls(user=user, name=name, expires=expires, prefix=body[:8], digest=digest(secret))
        token.full_clean()
        token.save()
        return token, secret
