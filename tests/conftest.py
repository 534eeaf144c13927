"""Shared fixtures: users with each role, and clients signed in as them.

The settings (PostgreSQL, Redis, a temporary data folder) are in tests/settings.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from tests import dbflush, threads

threads.watch()
dbflush.by_delete()

# Hypothesis judges its own pace too (a deadline per example, a health check on slow data
# generation): on a machine whose cores the run's other workers hold, those fail tests whose
# behaviour is right. The suite's tests never time things, so neither does hypothesis here;
# what each property checks is unchanged.
hypothesis_settings.register_profile(
    "llmgw", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("llmgw")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the run's files for its workers (``run.py`` passes ``--no-loadscope-reorder``
    with ``--dist loadfile``, so a worker takes the next file in this order when it is
    free): the end-to-end and browser files first, the longest first (by ``seconds``), so
    that the many quick files fill the workers' ends rather than one long file running
    alone at the end; the files that run llama-server last (``python3 run.py test`` builds
    it while the others run, tests/llama.py). Within a group, the files keep their order."""

    def needs_llama(item: pytest.Item) -> bool:
        return bool(item.get_closest_marker("llama_server")) or "llama_server" in getattr(
            item, "fixturenames", ()
        )

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::", 1)[0]

    def seconds(item: pytest.Item) -> float:
        """About how long a test takes: its ``takes`` marker's measured figure, else a
        minute for an end-to-end test (it starts processes of its own), 10 s for a browser
        test."""
        takes = item.get_closest_marker("takes")
        if takes:
            return float(takes.args[0])
        return (
            60
            if item.get_closest_marker("e2e")
            else 10
            if item.get_closest_marker("browser")
            else 0
        )

    llama = {module(i) for i in items if needs_llama(i)}
    cost: dict[str, float] = {}
    for i in items:
        cost[module(i)] = cost.get(module(i), 0) + seconds(i)

    def rank(item: pytest.Item) -> tuple[int, float]:
        name = module(item)
        return (2, 0) if name in llama else (0, -cost[name]) if cost[name] else (1, 0)

    items.sort(key=rank)


@pytest.fixture(autouse=True)
def _judges_breakers_closed() -> Iterator[None]:
    """Every test starts with each judge's circuit breaker closed: the breakers are the
    process's (guard.breaker), and a judge another test made fail must not be skipped here."""
    from guard import checks

    checks.BREAKERS.clear()
    yield


@pytest.fixture(autouse=True)
def _no_thread_outlives_its_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test fails when a thread of the project's it started is still running after its
    teardown (tests/threads.py: which thread, where it was started, where it is now; in
    the folders it has been run over, ``threads.CHECKED``)."""
    if not threads.checked(str(request.path)):
        yield
        return
    before = set(threading.enumerate())
    yield
    left = threads.left_running(before)
    if left:
        pytest.fail(
            f"{len(left)} thread(s) of the project's outlived this test (stop and join "
            "each before the test ends):\n  " + "\n  ".join(map(threads.describe, left)),
            pytrace=False,
        )


_HASHED: dict[tuple[str, str], str] = {}


def hashed(password: str) -> str:
    """The hash of ``password`` by the hasher in use (the production one unless a test sets
    another), made once a process: one hash costs 0.3 to 0.6 s of CPU on this project's
    machines (the hasher's iterations are its point), and 771 tests make users, most with
    the same password."""
    from django.contrib.auth.hashers import get_hasher, make_password

    key = (password, get_hasher().algorithm)
    if key not in _HASHED:
        _HASHED[key] = make_password(password)
    return _HASHED[key]


@pytest.fixture
def make_user(db: Any) -> Any:
    """Return a function that creates a user holding a role (or none)."""
    from django.contrib.auth.models import Group, User

    def make(username: str, role: str | None = None, password: str = "pw-for-tests-1") -> User:
        user = User.objects.create(
            username=username, password=hashed(password), is_staff=role is not None
        )
        if role:
            group, _ = Group.objects.get_or_create(name=role)
            user.groups.add(group)
        return user

    return make


@pytest.fixture
def viewer(make_user: Any) -> Any:
    """A user who may read."""
    return make_user("vera", "viewer")


@pytest.fixture
def operator(make_user: Any) -> Any:
    """A user who may change the catalog."""
    return make_user("otto", "operator")


@pytest.fixture
def admin_user(make_user: Any) -> Any:
    """A user who may manage users and tokens."""
    return make_user("ada", "admin")


@pytest.fixture
def outsider(make_user: Any) -> Any:
    """A signed-in user with no role."""
    return make_user("olga", None)


@pytest.fixture
def client_for(db: Any) -> Any:
    """Return a function giving a django.test.Client signed in as a user."""
    from django.test import Client

    def make(user: Any) -> Client:
        c = Client()
        c.force_login(user)
        return c

    return make


@pytest.fixture
def api_for(db: Any) -> Any:
    """Return a function giving a DRF APIClient authenticated as a user (session)."""
    from rest_framework.test import APIClient

    def make(user: Any) -> APIClient:
        c = APIClient()
        c.force_authenticate(user)
        return c

    return make
