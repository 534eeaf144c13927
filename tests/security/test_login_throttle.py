"""Sign-in throttling at /login/ and /admin/login/.

Through the real sign-in pages with Django's test client; the throttle's clock is the
test's own (no sleeps): a window passes when the test moves the clock.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.core.cache import caches
from django.test import Client, override_settings

from llmgw_admin.throttle import THROTTLE
from tests.redisserver import url as redis_url

pytestmark = pytest.mark.django_db

PASSWORD = "pw-for-tests-1"
ATTACKER = "203.0.113.5"
ELSEWHERE = "198.51.100.20"
PAGES = ["/login/", "/admin/login/"]
ROOT = Path(__file__).resolve().parents[2]


class Clock:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def quick_hashing(settings: Any) -> None:
    """Passwords hashed quickly: these tests try hundreds (the hasher is not tested)."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(THROTTLE, "clock", c)
    caches["default"].clear()
    yield c
    caches["default"].clear()


def sign_in(page: str, username: str, password: str, address: str, **extra: Any) -> Any:
    """Post the sign-in form from ``address`` with a fresh client (no session yet)."""
    c = Client(REMOTE_ADDR=address, **extra)
    r = c.post(page, {"username": username, "password": password, "next": "/cluster/"})
    r.signed_in = "_auth_user_id" in c.session
    return r


def refused_for_throttle(r: Any) -> bool:
    return r.status_code == 429 and b"Too many failed sign-ins" in r.content


@pytest.mark.parametrize("page", PAGES)
def test_fifty_wrong_passwords_then_the_right_one_is_refused_until_the_window_passes(
    page: str, admin_user: Any, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmgw_admin.throttle")
    answers = [sign_in(page, "ada", f"guess-{i}", ATTACKER) for i in range(50)]
    assert [r.status_code for r in answers[:4]] == [200] * 4  # the form, saying why
    assert all(refused_for_throttle(r) for r in answers[4:]), [r.status_code for r in answers]
    assert not any(r.signed_in for r in answers)

    right = sign_in(page, "ada", PASSWORD, ATTACKER)
    assert refused_for_throttle(right), right.status_code
    assert not right.signed_in
    assert 0 < int(right["Retry-After"]) <= 900
    assert b"try again in 15 minutes" in right.content

    clock.now += 899
    assert refused_for_throttle(sign_in(page, "ada", PASSWORD, ATTACKER))
    clock.now += 2
    after = sign_in(page, "ada", PASSWORD, ATTACKER)
    assert after.status_code == 302 and after.signed_in

    locked = [r for r in caplog.records if "sign-in locked" in r.getMessage()]
    assert locked and locked[0].levelno == logging.WARNING
    assert "'ada'" in locked[0].getMessage() and ATTACKER in locked[0].getMessage()
    assert PASSWORD not in caplog.text


def test_a_locked_sign_in_does_not_try_the_password(admin_user: Any, clock: Clock) -> None:
    """While locked, the right and a wrong password get the same answer, and neither
    counts: the lock does not grow while the attacker keeps trying."""
    for i in range(5):
        sign_in("/login/", "ada", f"guess-{i}", ATTACKER)
    right = sign_in("/login/", "ada", PASSWORD, ATTACKER)
    wrong = sign_in("/login/", "ada", "guess-x", ATTACKER)
    assert right.status_code == wrong.status_code == 429
    assert refused_for_throttle(right) and refused_for_throttle(wrong)
    assert b"Please enter a correct" not in wrong.content
    assert right["Retry-After"] == wrong["Retry-After"]
    clock.now += 901
    assert sign_in("/login/", "ada", PASSWORD, ATTACKER).signed_in


def test_the_user_elsewhere_and_other_users_are_not_locked_out(
    admin_user: Any, make_user: Any, clock: Clock
) -> None:
    make_user("bob", "viewer")
    for i in range(50):
        sign_in("/login/", "ada", f"guess-{i}", ATTACKER)
    # The user, from another address: the attacker's guesses at one address lock that
    # address, not the user everywhere.
    assert sign_in("/login/", "ada", PASSWORD, ELSEWHERE).signed_in
    assert sign_in("/admin/login/", "ada", PASSWORD, ELSEWHERE).signed_in
    # Another user from another address.
    assert sign_in("/login/", "bob", PASSWORD, ELSEWHERE).signed_in
    # Another user at the attacker's address (a shared NAT): refused sign-ins are not
    # tried, so they do not count towards the address's limit.
    assert sign_in("/login/", "bob", PASSWORD, ATTACKER).signed_in


def test_a_user_s_failures_below_the_limit_are_forgotten_on_success(
    admin_user: Any, clock: Clock
) -> None:
    for _ in range(3):
        for i in range(4):
            assert not sign_in("/login/", "ada", f"typo-{i}", ELSEWHERE).signed_in
        assert sign_in("/login/", "ada", PASSWORD, ELSEWHERE).signed_in


def test_guessing_many_users_from_one_address_locks_the_address(
    admin_user: Any, clock: Clock
) -> None:
    for i in range(20):
        sign_in("/login/", f"user-{i}", "guess", ATTACKER)
    assert refused_for_throttle(sign_in("/login/", "ada", PASSWORD, ATTACKER))
    assert sign_in("/login/", "ada", PASSWORD, ELSEWHERE).signed_in


def test_guessing_one_user_from_many_addresses_locks_the_user(
    admin_user: Any, clock: Clock
) -> None:
    for i in range(100):
        sign_in("/login/", "ada", "guess", f"10.9.{i // 200}.{i % 200 + 1}")
    assert refused_for_throttle(sign_in("/login/", "ada", PASSWORD, ELSEWHERE))
    clock.now += 901
    assert sign_in("/login/", "ada", PASSWORD, ELSEWHERE).signed_in


def test_x_forwarded_for_is_believed_only_from_a_trusted_proxy(
    admin_user: Any, clock: Clock
) -> None:
    # Not behind a proxy: a client choosing its X-Forwarded-For is still one address.
    for i in range(5):
        sign_in("/login/", "ada", "guess", ATTACKER, HTTP_X_FORWARDED_FOR=f"10.1.1.{i}")
    assert refused_for_throttle(
        sign_in("/login/", "ada", PASSWORD, ATTACKER, HTTP_X_FORWARDED_FOR="10.1.1.99")
    )

    # Behind the configured proxy, each client is the address the proxy saw.
    proxy = "10.0.0.2"
    with override_settings(LLMGW_TRUSTED_PROXIES=[proxy]):
        for _ in range(5):
            sign_in("/login/", "ada", "guess", proxy, HTTP_X_FORWARDED_FOR="192.0.2.66")
        assert refused_for_throttle(
            sign_in("/login/", "ada", PASSWORD, proxy, HTTP_X_FORWARDED_FOR="192.0.2.66")
        )
        # A client may put anything left of what the proxy appended.
        assert refused_for_throttle(
            sign_in("/login/", "ada", PASSWORD, proxy, HTTP_X_FORWARDED_FOR="192.0.2.7, 192.0.2.66")
        )
        assert sign_in(
            "/login/", "ada", PASSWORD, proxy, HTTP_X_FORWARDED_FOR="192.0.2.7"
        ).signed_in


REDIS = redis_url(15)


def test_failures_counted_by_another_process_lock_here_through_redis(
    admin_user: Any, clock: Clock
) -> None:
    """Production's web processes share the counts: five failures a separate process
    (configured as production, with LLMGW_REDIS_URL) records lock the sign-in here."""
    name = f"ada-{uuid.uuid4().hex[:8]}"
    admin_user.username = name
    admin_user.save()
    redis_cache = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS,
            "KEY_PREFIX": "llmgw",
        }
    }
    script = (
        "import django; django.setup()\n"
        "from llmgw_admin.throttle import THROTTLE\n"
        f"locks = [THROTTLE.failed({name!r}, {ATTACKER!r}) for _ in range(5)]\n"
        "print(locks[-1].scope if locks[-1] else 'none')\n"
    )
    env = dict(os.environ, LLMGW_REDIS_URL=REDIS, DJANGO_SETTINGS_MODULE="tests.settings")
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "user at address"
    with override_settings(CACHES=redis_cache):
        try:
            r = sign_in("/login/", name, PASSWORD, ATTACKER)
            assert refused_for_throttle(r), r.status_code
            assert sign_in("/login/", name, PASSWORD, ELSEWHERE).signed_in
        finally:
            THROTTLE.succeeded(name, ATTACKER)
            caches["default"].delete_many(
                [THROTTLE._key("lock", s, i) for s, i in THROTTLE._ids(name, ATTACKER)]
            )
