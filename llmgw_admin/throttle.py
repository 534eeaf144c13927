"""Sign-in throttling: failed sign-ins lock out a user at an address, an address, or a user.

Both sign-in pages (``/login/`` and ``/admin/login/``) check here before a password is
tried and count each failure here (``ThrottledLoginMixin``). Three counts, each over the
last ``LLMGW_LOGIN_WINDOW`` seconds:

- one user name from one address: ``LLMGW_LOGIN_LIMIT`` failures (default 5) lock that
  pair, so an attacker guessing one user's password at one address is stopped while the
  user signs in from anywhere else;
- one address, any user names: 4 x the limit (guessing many users' passwords);
- one user name, any address: 20 x the limit (guessing from many addresses), so an
  attacker at one address cannot lock a user out everywhere.

A lock lasts the window from the failure that reached the limit; a locked sign-in is
refused without trying the password, answered 429 with ``Retry-After`` and the form's
message, and logged. A sign-in that succeeds clears its user-at-address count.

The counts live in Django's cache: Redis when ``LLMGW_REDIS_URL`` is set, so every web
process counts the same failures; local memory in the embedded mode's one web process.
The address is the connection's peer, or what ``X-Forwarded-For`` says when the peer is
one of ``LLMGW_TRUSTED_PROXIES`` (``cluster.address.peer_address``).
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import iscoroutinefunction
from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm
from django.core.cache import caches
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

from cluster.address import peer_address

log = logging.getLogger(__name__)

PAIR = "user at address"
ADDRESS = "address"
USER = "user"
# Each scope's limit as a multiple of LLMGW_LOGIN_LIMIT (see the module's docstring).
FACTORS = {PAIR: 1, ADDRESS: 4, USER: 20}


@dataclass(frozen=True)
class Lock:
    """A refusal: which count is over its limit and how long until it may be tried."""

    scope: str
    retry_after: int

    def message(self) -> str:
        minutes = max(1, math.ceil(self.retry_after / 60))
        whose = {
            PAIR: "for this user from your address",
            ADDRESS: "from your address",
            USER: "for this user",
        }[self.scope]
        return (
            f"Too many failed sign-ins {whose}: try again in {minutes} "
            f"minute{'s' if minutes != 1 else ''}."
        )


def client_address(request: HttpRequest) -> str:
    """Return the address a request came from (``X-Forwarded-For`` only from a trusted
    proxy)."""

    return peer_address(
        request.META.get("REMOTE_ADDR", ""),
        request.META.get("HTTP_X_FORWARDED_FOR", ""),
        settings.LLMGW_TRUSTED_PROXIES,
    )


class LoginThrottle:
    """The three counts in the cache, read against ``clock`` (a test gives its own)."""

    def __init__(self, clock: Callable[[], float] = time.time, cache_alias: str = "default"):
        self.clock = clock
        self.cache_alias = cache_alias

    @property
    def window(self) -> int:
        return max(1, int(settings.LLMGW_LOGIN_WINDOW))

    def limits(self) -> dict[str, int]:
        base = max(1, int(settings.LLMGW_LOGIN_LIMIT))
        return {scope: base * factor for scope, factor in FACTORS.items()}

    def locked(self, username: str, address: str) -> Lock | None:
        """Return the lock that refuses this user at this address now, or None."""
        now = self.clock()
        cache = caches[self.cache_alias]
        try:
            found = cache.get_many(
                [self._key("lock", s, i) for s, i in self._ids(username, address)]
            )
        except Exception:
            log.exception("sign-in throttle: the cache cannot be read; not throttling")
            return None
        longest: Lock | None = None
        for scope, ident in self._ids(username, address):
            until = found.get(self._key("lock", scope, ident))
            if until is not None and until > now:
                lock = Lock(scope, max(1, math.ceil(until - now)))
                if longest is None or lock.retry_after > longest.retry_after:
                    longest = lock
        return longest

    def failed(self, username: str, address: str) -> Lock | None:
        """Count a failed sign-in; return the lock it starts, if it reaches a limit."""
        now = self.clock()
        window = self.window
        bucket = int(now // window)
        cache = caches[self.cache_alias]
        limits = self.limits()
        started: Lock | None = None
        try:
            for scope, ident in self._ids(username, address):
                key = self._key(f"n{bucket}", scope, ident)
                # Kept two windows: a count is this window's and the last one's.
                cache.add(key, 0, timeout=2 * window + 60)
                try:
                    count = cache.incr(key)
                except ValueError:  # expired between add and incr
                    cache.set(key, 1, timeout=2 * window + 60)
                    count = 1
                count += cache.get(self._key(f"n{bucket - 1}", scope, ident), 0)
                if count >= limits[scope]:
                    cache.set(self._key("lock", scope, ident), now + window, timeout=window + 60)
                    if started is None:
                        started = Lock(scope, window)
                        log.warning(
                            "sign-in locked for %s s: %s failed sign-ins for %s (user %r, "
                            "address %s) within %s s",
                            window,
                            count,
                            scope,
                            username[:150],
                            address,
                            window,
                        )
        except Exception:
            log.exception("sign-in throttle: the cache cannot be written; not throttling")
        return started

    def succeeded(self, username: str, address: str) -> None:
        """Clear the user-at-address count after a sign-in that worked."""
        bucket = int(self.clock() // self.window)
        ident = dict(self._ids(username, address))[PAIR]
        try:
            caches[self.cache_alias].delete_many(
                [self._key(f"n{b}", PAIR, ident) for b in (bucket, bucket - 1)]
            )
        except Exception:
            log.exception("sign-in throttle: the cache cannot be written")

    @staticmethod
    def _ids(username: str, address: str) -> list[tuple[str, str]]:
        # User names compare without case or surrounding blanks, so "Ada " counts as "ada".
        user = username.strip().casefold()
        return [(PAIR, f"{user}\0{address}"), (ADDRESS, address), (USER, user)]

    @staticmethod
    def _key(kind: str, scope: str, ident: str) -> str:
        digest = hashlib.sha256(f"{scope}\0{ident}".encode()).hexdigest()[:32]
        return f"llmgw:login:{kind}:{digest}"


THROTTLE = LoginThrottle()


class ThrottledLoginMixin:
    """A sign-in form that asks ``THROTTLE`` first and counts its failures."""

    request: HttpRequest
    cleaned_data: dict[str, Any]

    def clean(self) -> dict[str, Any]:
        username = str(self.cleaned_data.get("username") or "")
        address = client_address(self.request)
        lock = THROTTLE.locked(username, address)
        if lock is not None:
            log.info(
                "sign-in refused without trying the password: too many failures for %s "
                "(user %r, address %s); %s s left",
                lock.scope,
                username[:150],
                address,
                lock.retry_after,
            )
            raise self._refuse(lock)
        try:
            cleaned = super().clean()  # type: ignore[misc]
        except forms.ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                started = THROTTLE.failed(username, address)
                if started is not None:
                    raise self._refuse(started) from None
            raise
        THROTTLE.succeeded(username, address)
        return cleaned  # type: ignore[no-any-return]

    def _refuse(self, lock: Lock) -> forms.ValidationError:
        self.request.llmgw_retry_after = lock.retry_after  # type: ignore[attr-defined]
        return forms.ValidationError(lock.message(), code="throttled")


class LoginForm(ThrottledLoginMixin, AuthenticationForm):
    """The console's sign-in form."""


class AdminLoginForm(ThrottledLoginMixin, AdminAuthenticationForm):
    """The admin's sign-in form."""


@sync_and_async_middleware
def login_throttle_middleware(get_response: Any) -> Any:
    """Answer a sign-in the throttle refused with 429 and ``Retry-After`` (the page still
    shows the form and its message)."""
    if iscoroutinefunction(get_response):

        async def respond_async(request: HttpRequest) -> HttpResponse:
            return _mark(request, await get_response(request))

        return respond_async

    def respond(request: HttpRequest) -> HttpResponse:
        return _mark(request, get_response(request))

    return respond


def _mark(request: HttpRequest, response: HttpResponse) -> HttpResponse:
    retry_after = getattr(request, "llmgw_retry_after", None)
    if retry_after is not None:
        response.status_code = 429
        response["Retry-After"] = str(retry_after)
    return response
