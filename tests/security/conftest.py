"""The security tests' fixtures: the browser tests' headless Chromium, for the pages'
checks under the Content-Security-Policy."""

from __future__ import annotations

from tests.browser.conftest import browser  # noqa: F401  (a fixture)
