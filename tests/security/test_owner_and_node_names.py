"""/v1/models' owned_by never carries a line break or markup: a model's owner and a node's
name refuse control characters (and markup) on the surfaces that write them."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from catalog.models import ServedModel
from cluster.models import JoinToken, Node
from tests.catalog.samples import gpu_model
from tests.cluster.helpers import inventory

pytestmark = pytest.mark.django_db

URL = "/api/v1/catalog/models/"


@pytest.mark.parametrize(
    "owner",
    ["team:x\r\nSet-Cookie: a=b", "team:x\n", "org:\x1b[31m", "team:<script>x</script>",
     'team:a"b', "team:a&b", "team:\u202eevil"],
)  # fmt: skip
def test_an_owner_with_a_line_break_or_markup_is_refused(
    api_for: Any, operator: Any, owner: str
) -> None:
    r = api_for(operator).post(URL, gpu_model("m", owner=owner), format="json")
    assert r.status_code == 400, r.json()
    (error,) = [e for e in r.json()["errors"] if e["field"] == "owner"]
    assert error["code"] == "bad_owner" and "owned_by" in error["message"]
    assert "\n" not in error["message"] and "\r" not in error["message"]
    assert not ServedModel.objects.exists()


@pytest.mark.parametrize("owner", ["team:ml-platform", "org:acme.eu", "project:a/b@c"])
def test_a_plain_owner_passes(api_for: Any, operator: Any, owner: str) -> None:
    r = api_for(operator).post(URL, gpu_model("m", owner=owner), format="json")
    assert r.status_code == 201, r.json()


@pytest.mark.parametrize("name", ["gpu-1\r\nX-Evil: 1", "gpu\n1", "<b>gpu</b>", "gpu\x1b[31m"])
def test_a_node_name_with_a_control_character_or_markup_is_refused_at_join(name: str) -> None:
    _, secret = JoinToken.issue("rack")
    r = Client().post(
        "/api/v1/agent/join",
        {"token": secret, "name": name, "inventory": inventory(["nvidia-h100-80gb"])},
        content_type="application/json",
    )
    assert r.status_code == 400, r.content
    assert "one line of visible text" in r.json()["detail"]
    assert not Node.objects.exists()


@pytest.mark.parametrize(
    ("owner", "said"),
    [("team:x\r\nSet-Cookie: a=b", "llmgw"), ("team:<b>x</b>", "llmgw"), ("", "llmgw"),
     ("team:ml", "team:ml")],
)  # fmt: skip
def test_owned_by_never_carries_a_line_break_or_markup(owner: str, said: str) -> None:
    # A row written before the rule: /v1/models still hands clients nothing of it.
    from gateway.path.listing import owned_by

    assert owned_by(owner) == said
