"""API token authentication for the check endpoint, kept in memory for a second.

A gateway calls ``POST /api/v1/guard/check`` on every request it serves, with the same
token each time; looking the token and its user's role up on every call were two of
the check's queries. ``CachedTokenAuthentication`` keeps what ``TokenAuthentication``
found (the token, its user and the user's role) for ``TOKEN_TTL`` seconds, by the
token's digest (looked up again in the background from half that age, so calls do not
wait for it). Revocation still takes effect promptly:

- in this process at once: saving or deleting a token, a user or a user's groups drops
  every cached token (the tokens API's revoke, the admin's forms; :func:`forget`,
  connected in ``guard.signals``);
- otherwise (another process, or the admin's bulk revoke, an UPDATE that sends no
  signal) within ``TOKEN_TTL`` seconds;
- an expiry is checked on every call against the clock.

Only tokens that authenticate are kept: an unknown or refused one is looked up again
on every call. While the database is away or hung a token found before is trusted as it
was last read (``guard.cache``: a check waits at most half a second for it, then not at
all), and its last use is written in a thread of its own, so the checks of a gateway
that holds its token go on; an unknown token cannot be looked up then. Inside a transaction nothing is kept (tests: what a rolled-back
transaction saw is not for others).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from django.db import connection
from django.utils import timezone
from rest_framework import authentication

from guard.cache import CachedMap
from guard.snapshots import in_background
from llmgw_core.models import TOKEN_PREFIX, ApiToken, digest
from llmgw_core.roles import role_of
from llmgw_core.tokens import TokenAuthentication

log = logging.getLogger(__name__)

# How long a token found good is trusted without asking the database (seconds).
TOKEN_TTL = 1.0
# How often a token's last use is written (seconds), as TokenAuthentication does.
LAST_USED_EVERY = 60


class _Found:
    """A token that authenticated, with its user (role resolved) and when it was last used."""

    def __init__(self, user: Any, token: ApiToken) -> None:
        role_of(user)  # resolved now, kept on the user object
        self.user = user
        self.token = token


class CachedTokenAuthentication(TokenAuthentication):
    """``TokenAuthentication``, with a good token's lookup kept for ``TOKEN_TTL`` seconds."""

    def authenticate(self, request: Any) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).decode(errors="replace")
        parts = header.split()
        if (
            len(parts) != 2
            or parts[0].lower() not in self.keywords
            or not parts[1].startswith(TOKEN_PREFIX)
            or connection.in_atomic_block
        ):
            # Malformed or absent headers get TokenAuthentication's own answers.
            return super().authenticate(request)
        found = token_user(parts[1])
        if found is None:
            # Unknown, revoked, expired or a disabled user: the same errors as uncached.
            return super().authenticate(request)
        return found


def token_user(secret: str) -> tuple[Any, ApiToken] | None:
    """Return the user and token of a live API token's secret, from memory when fresh;
    None when it does not authenticate (``TokenAuthentication`` says why).

    The same user object for every call with this token: callers only read it (its role
    is resolved once, when the token is looked up).
    """
    found = _found.get(digest(secret))
    if found is None:
        return None
    token = found.token
    if token.state != "live":  # expired since it was cached
        _found.invalidate()
        return None
    now = timezone.now()
    if _use_due(token, now):
        token.last_used = now
        _write_last_use(token.pk, now)
    return found.user, token


def _write_last_use(pk: int, when: Any) -> None:
    """Write a token's last use in a thread of its own: the check never waits on the
    database for it (a database away costs the write, said in the log, not the check)."""

    def write() -> None:
        try:
            ApiToken.objects.filter(pk=pk).update(last_used=when)
        except Exception as error:
            log.warning("an API token's last use could not be written: %s", error)
        finally:
            connection.close()

    if connection.in_atomic_block:
        write()  # a test's transaction: another thread would not see the token
        return
    threading.Thread(target=write, name="guard-token-use", daemon=True).start()


def token_user_in_memory(secret: str) -> tuple[Any, ApiToken] | None:
    """Return ``token_user``'s answer when it needs no query: the token fresh in memory,
    live, its last use written recently. None otherwise (``token_user`` then decides)."""
    found = _found.fresh(digest(secret))
    if found is None:
        return None
    token = found.token
    if token.state != "live" or _use_due(token, timezone.now()):
        return None
    return found.user, token


def _use_due(token: ApiToken, now: Any) -> bool:
    """Return whether a token's last use is to be written now."""
    return token.last_used is None or (now - token.last_used).total_seconds() > LAST_USED_EVERY


def _lookup(key: str) -> _Found | None:
    token = ApiToken.objects.select_related("user").filter(digest=key).first()
    if token is None or token.state != "live" or not token.user.is_active:
        return None
    return _Found(token.user, token)


_found: CachedMap[str, _Found] = CachedMap(
    _lookup, ttl=TOKEN_TTL, ahead=in_background, name="the API tokens in memory"
)


def forget(**kwargs: Any) -> None:
    """Drop every cached token (a token, a user or a user's groups changed)."""
    _found.invalidate()
