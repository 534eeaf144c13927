"""A real headless Chromium (the Debian package) driving the console on a live server.

Playwright's own browser downloads are not used (no network here): the system Chromium
is launched by path. pytest-django's ``live_server`` serves the app in a thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
PASSWORD = "pw-for-tests-1"  # tests/conftest.py's make_user default
# Asked again while the page navigates: the answer is the next document's.
_NAVIGATING = ("Execution context was destroyed", "Cannot find context with specified id")


def wait_js(page: Any, expression: str, arg: Any = None, *, timeout: float = 10, what: str) -> Any:
    """Poll ``page.evaluate(expression, arg)`` until it is truthy; fail naming ``what``.

    The console's Content-Security-Policy refuses eval (``script-src 'self'``), and
    ``page.wait_for_function`` evaluates its predicate in the page with eval, on each
    animation frame: under the policy it fails. ``page.evaluate`` runs the expression
    through the DevTools protocol, which the policy does not govern, so it is asked from
    here until ``timeout`` seconds have passed. An expression that throws fails at once,
    as it did with ``wait_for_function``; a navigation in between is asked again.
    """
    from playwright.sync_api import Error

    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = page.evaluate(expression, arg)
        except Error as e:
            if not any(m in e.message for m in _NAVIGATING):
                raise
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(0.1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test here as a browser test (``-m "not browser"`` leaves them out)."""
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.browser)


# Module scope: Playwright's loop stays the thread's running loop while it is open, so
# it is closed before tests elsewhere run (an asyncio test could not start its own).
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Return a headless Chromium shared by a module's tests.

    While it is open, Django is told database calls from this thread are safe: Playwright's
    sync API keeps an event loop running here, and Django refuses database calls from a
    thread with a running loop (the loop only waits on the browser). The tests' own
    database setup and teardown fall inside, and tests elsewhere keep Django's guard.
    """
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install -y chromium")
    with pytest.MonkeyPatch.context() as mp, sync_playwright() as p:
        mp.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield chromium
        chromium.close()


@pytest.fixture
def signed_in(browser: Any, live_server: Any) -> Iterator[Callable[[Any], Any]]:
    """Return a function opening a new page signed in as a user, through the login form."""
    contexts = []

    def open_as(user: Any) -> Any:
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"{live_server.url}/login/")
        page.fill("#id_username", user.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/cluster/")  # signing in lands on the dashboard
        # The catalog's tests start from its list. live_server serves HTTP only (WSGI): the
        # dashboard's socket is tested against the real server in tests/e2e and tests/cluster.
        page.goto(f"{live_server.url}/catalog/")
        return page

    yield open_as
    for context in contexts:
        context.close()


# live_server serves HTTP only (WSGI): the dashboard's socket fails there, and htmx's ws
# extension says so (an Event, logged); the live pages are walked in tests/e2e.
_SOCKET = ("WebSocket connection to", "[object Event]")


@pytest.fixture
def open_page(browser: Any, live_server: Any) -> Iterator[Callable[..., Any]]:
    """Return a function opening a signed-in page; ``page.errors`` collects its errors."""
    contexts = []

    def open_as(user: Any, path: str, viewport: dict[str, int] | None = None) -> Any:
        context = browser.new_context(viewport=viewport or {"width": 1280, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        # Generous: a loaded 2-core machine has kept the live server's login past 10 s.
        page.set_default_timeout(30_000)
        errors: list[str] = []

        def said(m: Any) -> None:
            if m.type in ("error", "warning") and not any(s in m.text for s in _SOCKET):
                errors.append(f"{m.type}: {m.text}")

        page.on("console", said)
        page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
        page.errors = errors
        page.goto(f"{live_server.url}/login/?next={path}")
        page.fill("#id_username", user.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}{path}")
        return page

    yield open_as
    for context in contexts:
        context.close()
