"""API tokens for scripts, stored hashed, each saying who made it."""

from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

TOKEN_PREFIX = "llmgw_"

log = logging.getLogger("llmgw.tokens")


def issue_problem(maker: object, for_user: object, by_token: bool = False) -> str:
    """Return why ``maker`` may not issue an API token for ``for_user``, or "".

    A user issues tokens for itself only; a superuser for anyone (``ApiToken.issue`` logs
    it). Never through a token: a leaked token would make more, which outlive its revoking.
    """
    if by_token:
        return (
            "a token cannot issue tokens (one leaked would make more that outlive it): sign "
            "in to issue one"
        )
    if getattr(maker, "pk", None) == getattr(for_user, "pk", None):
        return ""
    if getattr(maker, "is_superuser", False):
        return ""
    return (
        f"you may issue tokens for yourself ({getattr(maker, 'username', '')}) only: a token "
        f"for {getattr(for_user, 'username', '')} is issued by them, or by a superuser"
    )


def digest(secret: str) -> str:
    """Return the stored form of a token: its SHA-256, hex.

    A plain hash suffices (no salt or stretching): tokens are 32 random bytes, so there is
    no dictionary to try, and checking one must stay cheap on every API call.
    """
    return hashlib.sha256(secret.encode()).hexdigest()


def revoke(token: Any) -> bool:
    """Mark a secret shown once (an API token, a join token, a client key) revoked now: it
    stops working at once and its row stays. False when it already was (nothing written)."""
    if token.revoked is not None:
        return False
    token.revoked = timezone.now()
    token.save(update_fields=["revoked"])
    return True


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
    # Who made it: the signed-in user (kept by name too, should that user be deleted), or
    # the command line ("command line (root@host)").
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="api_tokens_made",
        editable=False,
    )
    created_by_name = models.CharField(_("created by"), max_length=200, blank=True, editable=False)

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
        cls,
        user: object,
        name: str,
        expires: datetime | None = None,
        *,
        by: object = None,
        by_name: str = "",
    ) -> tuple[ApiToken, str]:
        """Create a token and return it with its secret, which is never stored.

        ``by`` is the user who makes it (``by_name`` says who otherwise: the command
        line); a token made for another user is logged as such.
        """
        body = secrets.token_urlsafe(32)
        secret = f"{TOKEN_PREFIX}{body}"
        maker = by_name or str(getattr(by, "username", "") or "")
        token = cls(
            user=user,
            name=name,
            expires=expires,
            prefix=body[:8],
            digest=digest(secret),
            created_by=by,
            created_by_name=maker,
        )
        token.full_clean()
        token.save()
        owner = getattr(user, "username", "")
        if maker != owner:
            log.warning(
                "API token %s (%s) for %s issued by %s%s",
                token.pk,
                name,
                owner,
                maker or "nobody named",
                " (superuser)" if getattr(by, "is_superuser", False) else "",
            )
        else:
            log.info("API token %s (%s) issued by %s for itself", token.pk, name, owner)
        return token, secret
