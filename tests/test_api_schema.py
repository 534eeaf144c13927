"""The API against its own OpenAPI schema, by schemathesis.

Every operation in ``/api/schema/`` is called with examples drawn from the schema on a
live server, as an admin's API token: no answer may be a 5xx, and every answer's body and
content type must be what the schema says for its status. The examples are the same every
run (a fixed seed) and few, so CI fails only on a change; ``LLMGW_SCHEMA_EXAMPLES=200``
draws more, at random.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
)

from llmgw_core.models import ApiToken
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

EXTRA = int(os.environ.get("LLMGW_SCHEMA_EXAMPLES", "0"))
CHECKS = [not_a_server_error, response_schema_conformance, content_type_conformance]


@pytest.fixture
def api_schema(transactional_db: Any, live_server: Any, make_user: Any) -> Any:
    """The schema the live server serves to an admin's token, with a row in each list."""
    import httpx

    admin = make_user("ada", "admin")
    _, secret = ApiToken.issue(admin, "schemathesis")
    store(gpu_model("chat"))
    join_node("gpu-1", ["nvidia-h100-80gb"] * 2)
    from django.utils import timezone

    from gateway.models import Refusal

    Refusal.objects.create(at=timezone.now(), request_id="req_1", direction="answer", key="app",
                           judge="judge", categories=["Violent"], score=0.9)  # fmt: skip
    headers = {"Authorization": f"Bearer {secret}"}
    raw = httpx.get(
        f"{live_server.url}/api/schema/", headers=headers | {"Accept": "application/json"}
    )
    assert raw.status_code == 200, raw.text[:300]
    schema = schemathesis.openapi.from_dict(raw.json())
    # The coverage phase draws every boundary of every parameter (minutes here); the
    # examples and the fuzzing phases, with few examples, stay within CI's time.
    schema.config.phases.coverage.enabled = EXTRA > 0
    schema.llmgw_headers = headers  # type: ignore[attr-defined]
    schema.llmgw_url = live_server.url  # type: ignore[attr-defined]
    return schema


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(
    max_examples=EXTRA or 8,
    derandomize=not EXTRA,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_as_its_schema_says(case: Any, api_schema: Any) -> None:
    case.call_and_validate(
        base_url=api_schema.llmgw_url,
        headers=api_schema.llmgw_headers,
        checks=CHECKS,
    )


def test_every_list_and_page_as_a_plain_call_answers_as_the_schema_says(api_schema: Any) -> None:
    """Each GET with no parameters but its path's (a model's name, an id of a row there
    is), as a script's first call is: the answers are full, so every field is checked."""
    from catalog.models import ServedModel

    ids = {"name": "chat", "id": str(ServedModel.objects.get(name="chat").pk)}
    called = []
    for result in api_schema.get_all_operations():
        operation = result.ok()
        if operation.method.upper() != "GET":
            continue
        path_parameters = {p.name for p in operation.path_parameters}
        if not path_parameters <= set(ids):
            continue
        case = operation.Case(path_parameters={k: ids[k] for k in path_parameters})
        response = case.call_and_validate(
            base_url=api_schema.llmgw_url, headers=api_schema.llmgw_headers, checks=CHECKS
        )
        called.append((operation.path, response.status_code))
    assert ("/api/v1/catalog/models/", 200) in called, called
    assert ("/api/v1/guard/judges", 200) in called, called
