"""The request log leaves out an agent's ordinary answers from the mirror's API (the first
start's console printed "Conflict: /api/v1/updates/mirror/models/..." a line a retry),
and keeps every other 4xx, a wrong token on that same route included."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.test import Client

from tests.updates.conftest import hub  # noqa: F401 - fixture
from tests.updates.test_api import _node_client, placed  # noqa: F401 - fixture

pytestmark = pytest.mark.django_db


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "django.request"]


def test_an_agents_404_from_the_mirror_is_not_a_warning_a_wrong_token_is(
    hub: Any,  # noqa: F811
    placed: list[tuple[Any, str]],  # noqa: F811
    settings: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings.LLMGW_MIRROR = False  # the mirror answers 404 "off": the node fetches itself
    caplog.set_level(logging.WARNING, logger="django.request")
    path = "/api/v1/updates/mirror/models/chat/"
    assert _node_client(placed[0][1]).get(path).status_code == 404
    assert _warned(caplog) == []
    assert Client().get(path).status_code == 401
    assert _warned(caplog) == [f"Unauthorized: {path}"]
    Client().get("/no/such/page/")
    assert _warned(caplog)[-1] == "Not Found: /no/such/page/"
