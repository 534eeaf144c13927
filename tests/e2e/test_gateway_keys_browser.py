"""Client keys as an operator meets them: in real Chromium against a
real ``manage.py serve``, a key is created on the console's page and shown once, the
official ``openai`` client uses it on the same port, and once it is revoked (confirmed
first) the gateway refuses it; a viewer sees the keys with no button to change them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import openai
import pytest

from tests.e2e.conftest import ControlPlane, wait_for

pytestmark = pytest.mark.e2e


def refused(api: openai.OpenAI) -> bool:
    try:
        api.models.list()
    except openai.AuthenticationError:
        return True
    return False


def test_an_operator_creates_uses_and_revokes_a_key_in_the_browser(
    control_plane: ControlPlane, console: Callable[..., Any], operator: Any, viewer: Any
) -> None:
    page = console(operator, "/gateway/keys/")
    page.fill("#id_name", "browser-app")
    page.fill("#id_owner", "team:web")
    page.fill("#id_rpm", "600")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#key-created [data-role=secret]").inner_text().strip()
    assert re.fullmatch(r"llmgw-ck-[A-Za-z0-9_-]{40,}", secret)
    row = page.locator('tr[data-key="browser-app"]')
    assert row.locator("[data-role=state]").inner_text() == "live"
    assert "team:web" in row.inner_text() and "600 req/min" in row.inner_text()

    # Shown once: the list, opened again, has only its prefix.
    page.goto(control_plane.url + "/gateway/keys/")
    assert secret not in page.content()
    assert secret[:17] in page.locator('tr[data-key="browser-app"]').inner_text()

    api = openai.OpenAI(base_url=control_plane.url + "/v1", api_key=secret, max_retries=0)
    wait_for(lambda: not refused(api), 30, "the gateway to take the new key")
    assert api.models.list().data == []  # no model yet: an empty list, not a refusal

    # A viewer reads the same list, with no way to change it.
    seen = console(viewer, "/gateway/keys/")
    assert seen.locator('tr[data-key="browser-app"]').count() == 1
    assert seen.locator("#key-form").count() == 0
    assert seen.get_by_role("link", name="Revoke").count() == 0

    page.locator('tr[data-key="browser-app"]').get_by_role("link", name="Revoke").click()
    page.get_by_role("button", name="Revoke browser-app").click()
    assert "Revoked client key browser-app." in page.locator(".messages, main").first.inner_text()
    assert page.locator('tr[data-key="browser-app"] [data-role=state]').inner_text() == "revoked"
    wait_for(lambda: refused(api), 5, "the revoked key refused")
