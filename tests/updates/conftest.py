"""Fixtures of the updates tests: the Hub stand-in, and the settings pointing at it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.updates.hubstandin import HubStandIn


@pytest.fixture
def hub(settings: Any, tmp_path: Any) -> Iterator[HubStandIn]:
    """A running Hub stand-in; HF_ENDPOINT, the mirror's hosts and folder set to it."""
    with HubStandIn() as stand_in:
        settings.HF_ENDPOINT = stand_in.url
        settings.LLMGW_MIRROR = True
        settings.LLMGW_MIRROR_HOSTS = [stand_in.url]
        settings.LLMGW_MIRROR_DIR = tmp_path / "mirror"
        settings.LLMGW_MIRROR_MAX_GB = 0
        settings.LLMGW_HF_TOKEN_FILE = ""
        yield stand_in
