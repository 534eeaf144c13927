"""Values the rules accept but the database cannot hold: refused naming the field, not 500s.

Found by tests/test_api_fuzz.py with more examples (LLMGW_FUZZ_EXAMPLES): a model name of
5,000 characters, ``scaling.max: 2147483648``, and text holding a NUL character, which
PostgreSQL stores neither in text nor in JSON.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from rest_framework.test import APIClient

from catalog.models import ChangeRecord, ServedModel
from cluster.models import Node
from tests.catalog.samples import gpu_model
from tests.catalog.test_commands import run, write
from tests.cluster.helpers import inventory, join_node

pytestmark = pytest.mark.django_db

URL = "/api/v1/catalog/models/"


@pytest.fixture
def api(operator: Any) -> APIClient:
    c = APIClient()
    c.force_authenticate(operator)
    return c


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"name": "a" * 5000}, "name", "5000 characters is too long: at most 200"),
        ({"scaling": {"min": 1, "max": 2**31}}, "scaling.max", "2147483648 is out of range"),
        ({"description": "x" * 10}, None, None),  # the control: this one is stored
        (
            {"profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "nvidia-h100-80gb",
                           "tp": 2, "startup_timeout": "20m", "priority": 2**40}]},
            "profiles[0].priority",
            "1099511627776 is out of range",
        ),
    ],
)  # fmt: skip
def test_the_api_refuses_what_no_column_holds_naming_the_field(
    api: APIClient, change: dict[str, Any], field: str | None, says: str | None
) -> None:
    r = api.post(URL, {**gpu_model("chat"), **change}, format="json")
    if field is None:
        assert r.status_code == 201, r.json()
        return
    assert r.status_code == 400, r.content
    (error,) = r.json()["errors"]
    assert error["field"] == field and says in error["message"]
    assert not ServedModel.objects.exists() and not ChangeRecord.objects.exists()


def test_text_with_a_nul_character_is_refused_saying_where(api: APIClient) -> None:
    r = api.post(URL, gpu_model("chat", description="a\x00b"), format="json")
    assert r.status_code == 400
    assert r.json()["detail"] == (
        "description: contains a NUL character (\\u0000), which cannot be stored: remove it"
    )
    assert not ServedModel.objects.exists()


def test_a_file_import_names_the_model_and_field(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "models:\n  - name: chat\n    source: org/chat\n"
        "    profiles: [{name: h100, engine: vllm, gpu_class: nvidia-h100-80gb, tp: 2}]\n"
        "    scaling: {min: 1, max: 2147483648}\n",
    )
    code, _, err = run("import", path)
    assert code == 1
    assert "models[0].scaling.max" in err and "2147483648 is out of range" in err
    assert not ServedModel.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_agent_naming_its_engines_with_a_nul_is_refused_on_the_lean_path_too() -> None:
    from llmgw_admin.asgi import application

    node, token = join_node("gpu-1", ["nvidia-h100-80gb"])
    bad = inventory(["nvidia-h100-80gb"], hostname="gpu-1", engines={"vllm": "0.11\x00"})

    async def beat() -> httpx.Response:
        transport = httpx.ASGITransport(app=application)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return await c.post(
                "/api/v1/agent/heartbeat",
                json={"inventory": bad},
                headers={"Authorization": f"Bearer {token}"},
            )

    r = asyncio.run(beat())
    assert r.status_code == 400
    assert r.json()["detail"] == (
        "inventory.engines.vllm: contains a NUL character (\\u0000), "
        "which cannot be stored: remove it"
    )
    assert Node.objects.get(pk=node.pk).engines == node.engines
