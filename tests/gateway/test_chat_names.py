"""The console's chat answers a model whatever name the catalog holds: a name
stored before the rule that refuses control characters put a raw CR into the answer's
``x-llmgw-model`` header, and the web server dropped the connection instead."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.session import PATH, SessionChat
from tests.gateway.harness import Harness, model


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["cr\rmodel", "lf\nmodel", "esc\x1bmodel"])
def test_the_chat_answers_a_model_whose_stored_name_holds_a_control_character(
    h: Harness, viewer: Any, name: str
) -> None:
    from django.conf import settings
    from django.test import Client

    h.app = SessionChat(h.gateway, h.gateway)
    h.serve([model(name)], [(7, name, h.engine("e", words=2))])
    browser = Client()
    browser.force_login(viewer)
    secret = "a" * 32
    cookies = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value,
               settings.CSRF_COOKIE_NAME: secret}  # fmt: skip
    answer = httpx.post(h.url + PATH, cookies=cookies, timeout=10,
                        headers={"X-CSRFToken": secret},
                        json={"model": name, "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"]
    # The header says which model answered, its control character written out.
    assert "\\u00" in answer.headers["x-llmgw-model"]
