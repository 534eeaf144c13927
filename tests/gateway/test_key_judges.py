"""No client key may name a judge, by its name, an alias or an adapter:
refused the same way in the console, the API and the command, and nothing is made.
Before, a key could list a judge's alias (the gateway held; the key should not exist)."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from gateway.models import ClientKey
from tests.catalog.samples import gpu_model, store

pytestmark = pytest.mark.django_db


@pytest.fixture
def judge() -> None:
    store(gpu_model("chat"),
          gpu_model("referee", role="guard", guard={"format": "qwen3guard"}, aliases=["ref"]))  # fmt: skip


@pytest.mark.parametrize("name", ["referee", "ref"])
def test_a_judge_or_its_alias_is_refused_in_a_key_everywhere(
    judge: None, operator: Any, client_for: Any, api_for: Any, name: str
) -> None:
    page = client_for(operator).post("/gateway/keys/create/",
                                     {"name": "k1", "models": f"chat {name}"})  # fmt: skip
    assert page.status_code == 400 and f"{name} judge traffic" in page.content.decode()
    made = api_for(operator).post("/api/v1/gateway/keys/", {"name": "k2", "models": [name]},
                                  format="json")  # fmt: skip
    assert made.status_code == 400 and f"{name} judge traffic" in made.content.decode()
    with pytest.raises(CommandError, match=f"{name} judge traffic"):
        call_command("gateway", "key", "create", "k3", "--model", name, stdout=io.StringIO())
    assert not ClientKey.objects.exists()
    # The model beside it is fine.
    made = api_for(operator).post("/api/v1/gateway/keys/", {"name": "k4", "models": ["chat"]},
                                  format="json")  # fmt: skip
    assert made.status_code == 201
