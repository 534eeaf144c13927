"""Every API call that takes a body, given bodies that are almost right and bodies that
are wrong in every way: never a 500, and a refusal says what is wrong.

The bodies are a valid body with one part replaced, removed or added (hypothesis), so
they get past the first checks and reach the deeper ones, plus arbitrary JSON. A request
that raises is a failure here (the test client re-raises), with its traceback.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from cluster.models import JoinToken, Node
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import inventory, join_node

pytestmark = pytest.mark.django_db

H100 = "nvidia-h100-80gb"
UNTIL = "2099-01-01T00:00:00Z"

# Scalars that break code in the usual ways: wrong types, huge numbers, odd strings.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([0, -1, 2**31, 2**63, 10**30, -(10**30)]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=40),
    st.sampled_from(["", " ", "\x00", "a" * 5000, "../../etc", "<script>", "1e999", UNTIL]),
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a JSON value, as keys and indexes from the top."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += paths(v, (*prefix, i))
    return found


@st.composite
def mutated(draw: Any, valid: dict[str, Any]) -> Any:
    """``valid`` with one place replaced, removed, or given an extra key; or any JSON."""
    if draw(st.integers(0, 9)) == 0:
        return draw(JSON)
    body = json.loads(json.dumps(valid))
    where = draw(st.sampled_from(paths(body)))
    if where == ():  # the top: one more key
        body[draw(st.text(min_size=1, max_size=12))] = draw(JSON)
        return body
    parent = body
    for step in where[:-1]:
        parent = parent[step]
    how = draw(st.sampled_from(["replace", "remove", "add"]))
    if how == "replace":
        parent[where[-1]] = draw(JSON)
    elif how == "remove":
        del parent[where[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=12))] = draw(JSON)
    else:
        parent.append(draw(JSON))
    return body


def check(response: Any, what: str) -> None:
    """A refusal is a 4xx JSON answer that says something; nothing is a 5xx."""
    assert response.status_code < 500, f"{what}: {response.status_code} {response.content[:300]!r}"
    if response.status_code >= 400:
        body = response.json()
        assert body, f"{what}: an empty refusal"


def sender(client: APIClient, method: str, url: str) -> Any:
    def send(body: Any) -> Any:
        return getattr(client, method)(url, body, format="json")

    return send


# The same examples every run, so a CI run fails only on a change; to look further, run
# with LLMGW_FUZZ_EXAMPLES=2000 (random examples, a new draw each run).
EXTRA = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=EXTRA or 60,
    derandomize=not EXTRA,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def admin_api(admin_user: Any) -> APIClient:
    c = APIClient()
    c.force_authenticate(admin_user)
    return c


@pytest.fixture
def catalog() -> None:
    store(gpu_model("chat"))


CALLS: list[tuple[str, str, dict[str, Any]]] = [
    ("post", "/api/v1/catalog/models/", gpu_model("fuzzed")),
    ("put", "/api/v1/catalog/models/chat/", gpu_model("chat")),
    ("patch", "/api/v1/catalog/models/chat/", {"scaling": {"max": 3}, "description": "d"}),
    ("post", "/api/v1/cluster/budgets/", {"level": "rack", "name": "r1", "cap_watts": 5000}),
    ("post", "/api/v1/cluster/join-tokens/", {"name": "n", "max_uses": 2, "expires": UNTIL}),
    ("post", "/api/v1/tokens/", {"user": "ada", "name": "ci", "expires": UNTIL}),
    (
        "post",
        "/api/v1/gateway/keys/",
        {
            "name": "app",
            "owner": "team:t",
            "models": ["chat"],
            "rpm": 5,
            "tpm": 0,
            "expires": UNTIL,
        },
    ),
    (
        "post",
        "/api/v1/gateway/peers/",
        {"name": "east", "url": "https://east.example", "key_file": "east"},
    ),
    ("post", "/api/v1/cluster/models/chat/demand/", {}),
    ("post", "/api/v1/cluster/models/chat/roll/", {}),
    ("post", "/api/v1/cluster/models/chat/bench/", {"profile": "h100"}),
    ("post", "/api/v1/guard/check", {"request": "hello", "answer": "hi"}),
    (
        "put",
        "/api/v1/guard/policy",
        {
            "judge": {"models": ["qwen3guard-0.6b"], "controversial": "safe"},
            "fail": "open",
            "directions": ["requests", "answers"],
            "categories": ["Violent"],
        },
    ),
    ("post", "/api/v1/guard/judges/enable", {"name": "llamaguard3-1b", "where": "sim"}),
]


@pytest.mark.parametrize(("method", "url", "valid"), CALLS, ids=[f"{m} {u}" for m, u, _ in CALLS])
def test_console_api_bodies(
    method: str, url: str, valid: dict[str, Any], admin_api: APIClient, catalog: None
) -> None:
    send = sender(admin_api, method, url)

    @FUZZ
    @given(body=mutated(valid))
    def run(body: Any) -> None:
        check(send(body), f"{method} {url} {json.dumps(body)[:300]}")

    run()


def test_a_budget_change_is_checked_too(admin_api: APIClient) -> None:
    r = admin_api.post(
        "/api/v1/cluster/budgets/",
        {"level": "rack", "name": "r1", "cap_watts": 5000},
        format="json",
    )
    assert r.status_code == 201, r.json()
    send = sender(admin_api, "patch", f"/api/v1/cluster/budgets/{r.json()['id']}/")

    @FUZZ
    @given(body=mutated({"level": "rack", "name": "r1", "cap_watts": 4000}))
    def run(body: Any) -> None:
        check(send(body), f"patch budget {json.dumps(body)[:300]}")

    run()


def test_agent_join_bodies() -> None:
    _, secret = JoinToken.issue("fuzz", max_uses=None)
    client = APIClient()

    @FUZZ
    @given(body=mutated({"token": secret, "name": "n1", "inventory": inventory([H100])}))
    def run(body: Any) -> None:
        check(client.post("/api/v1/agent/join", body, format="json"), json.dumps(body)[:300])

    run()


def test_agent_heartbeat_and_report_bodies() -> None:
    store(gpu_model("chat"))
    node, token = join_node("gpu-1", [H100])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    heartbeat = {"inventory": inventory([H100], hostname="gpu-1")}
    report = {
        "reports": [
            {
                "replica": 1,
                "generation": 1,
                "state": "loading",
                "reason": "downloading weights",
                "progress": 0.37,
                "port": 41234,
                "pid": 9876,
                "restarts": 0,
                "at": "2026-11-30T10:00:00Z",
            }
        ]
    }

    @FUZZ
    @given(body=mutated(heartbeat))
    def beats(body: Any) -> None:
        check(client.post("/api/v1/agent/heartbeat", body, format="json"), json.dumps(body)[:300])

    @FUZZ
    @given(body=mutated(report))
    def reports(body: Any) -> None:
        check(client.post("/api/v1/agent/report", body, format="json"), json.dumps(body)[:300])

    beats()
    reports()
    assert Node.objects.get(pk=node.pk).name == "gpu-1"


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"\xff\xfe", b"NaN", b'{"request": NaN}', b"[" * 5000, b""],
    ids=["broken", "not-utf8", "nan", "nan-inside", "nested-5000", "empty"],
)
@pytest.mark.parametrize(("method", "url", "valid"), CALLS, ids=[f"{m} {u}" for m, u, _ in CALLS])
def test_bytes_that_are_not_json(
    raw: bytes, method: str, url: str, valid: dict[str, Any], admin_api: APIClient, catalog: None
) -> None:
    r = getattr(admin_api, method)(url, raw, content_type="application/json")
    check(r, f"{method} {url} {raw[:40]!r}")
