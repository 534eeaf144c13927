"""Everything of a request the engine reads is judged: tool calls' arguments and names,
legacy function calls, the tools and functions a request defines. The real guard (a sim
judge process) through the real gateway, under a policy that judges requests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.path.guarding import Guard
from gateway.records.state import State
from guard import records
from guard import services as guard_services
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Harness
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

MARK = "UNSAFE-MARKER"  # what the sim judge flags


@pytest.fixture
def gateway() -> Iterator[tuple[Harness, str]]:
    judge, judge_url = launch("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "0",
                              "--tps", "100000")  # fmt: skip
    h = Harness(state=State(), guard=Guard())
    try:
        engine_url = h.engine("e", say="fine words").url
        guard_model("judge", endpoint=judge_url)
        store(sim_model("chat", tp=None, capabilities={"tools": True}))
        Replica.objects.create(model_name="chat", state="ready", endpoint=engine_url, profile="sim")
        guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"],
                                   "fail": "closed"}, surface="cli")  # fmt: skip
        _, secret = keys.create_key("k")
        records.start()
        h.serve([], [])
        yield h, secret
    finally:
        h.close()
        records.RECORDER.stop()
        stop(judge)


def asked(say: str) -> dict[str, dict[str, Any]]:
    """Requests that hide ``say`` where a chat template reads it but content is not."""
    tool_call = {"id": "c1", "type": "function",
                 "function": {"name": "search", "arguments": f'{{"query": "{say}"}}'}}  # fmt: skip
    history = [
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
    ]
    user = [{"role": "user", "content": "hello"}]
    tool = {"type": "function", "function": {"name": "search", "description": f"finds {say}",
                                             "parameters": {"type": "object"}}}  # fmt: skip
    legacy = [{"role": "assistant", "content": None,
               "function_call": {"name": "search", "arguments": f'{{"q": "{say}"}}'}},
              {"role": "function", "name": "search", "content": "found"}]  # fmt: skip
    return {
        "tool_call_arguments": {"messages": history},
        "tool_description": {"messages": user, "tools": [tool]},
        "legacy_function_call": {"messages": [*user, *legacy]},
        "legacy_function_definition": {
            "messages": user,
            "functions": [{"name": "search", "description": f"finds {say}"}],
        },  # fmt: skip
    }


@pytest.mark.parametrize("where", sorted(asked(MARK)))
def test_an_unsafe_request_hidden_in_tools_is_refused(
    gateway: tuple[Harness, str], where: str
) -> None:
    gw, secret = gateway
    headers = {"Authorization": f"Bearer {secret}"}
    url = gw.url + "/v1/chat/completions"
    safe = httpx.post(url, json={"model": "chat", **asked("weather")[where]}, headers=headers,
                      timeout=20)  # fmt: skip
    assert safe.status_code == 200, safe.text
    assert safe.json()["choices"][0]["message"]["content"] == "fine words"
    r = httpx.post(url, json={"model": "chat", **asked(MARK)[where]}, headers=headers, timeout=20)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "content_filter"
    assert "fine words" not in r.text


def test_a_prompt_of_token_ids_is_refused_where_requests_are_judged(
    gateway: tuple[Harness, str],
) -> None:
    """The guard reads text, not ids: under a policy that judges requests, ids would pass
    unjudged. The client is told to send text; the engine never sees it."""
    gw, secret = gateway
    r = httpx.post(gw.url + "/v1/completions", timeout=20,
                   headers={"Authorization": f"Bearer {secret}"},
                   json={"model": "chat", "prompt": [1, 2, 3], "max_tokens": 4})  # fmt: skip
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "prompt" and "send it as text" in error["message"]
    assert "fine words" not in r.text
