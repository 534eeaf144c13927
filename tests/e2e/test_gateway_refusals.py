"""A refusal found again by the request id its client got, as people meet it:
the official ``openai`` client against a real ``manage.py serve``, a real agent, a sim
engine and a real sim judge; the operator finds the request id in the console's Refusals
list in real Chromium (reached from the Traffic page) and through the API, and a viewer's
chat shows the id of its refused answer, linked to the record."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from cluster.models import Node
from gateway.models import Refusal
from llmgw_core.models import ApiToken
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import (
    H100,
    _refused_as_filter,
    gateway_process,
    new_key,
    ready,
    set_policy,
    sim_model,
    streamed_text,
)

pytestmark = pytest.mark.e2e


def find_in_console(page: Any, url: str, request_id: str) -> Any:
    """Look the request id up on the Refusals page, as an operator pastes it, until the
    gateway's writer (about once a second) has written it; return its row."""
    row = page.locator(f'#refusals tr[data-request-id="{request_id}"]')

    def found() -> bool:
        page.goto(url + "/gateway/refusals/")
        page.fill("input[name=request_id]", request_id)
        page.click("#refusal-filters button[type=submit]")
        page.wait_for_load_state()
        return row.count() == 1

    wait_for(found, 20, f"{request_id} on the Refusals page")
    return row


def test_an_operator_finds_a_refused_request_by_the_id_its_client_got(
    control_plane: ControlPlane, agents: Callable[..., Agent], console: Callable[..., Any],
    operator: Any, viewer: Any, tmp_path: Path,
) -> None:  # fmt: skip
    cp = control_plane
    agents("guard-node", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("chat"), sim_model("judge", role="guard", guard={"format": "qwen3guard"}))
    wait_for(ready("chat"), 90, "the chat model ready")
    wait_for(ready("judge"), 90, "the judge ready")
    key = new_key(cp, "support-bot", "--owner", "team:support")
    api = openai.OpenAI(base_url=cp.url + "/v1", api_key=key, max_retries=0)

    # 1. Answers judged: a streamed answer refused mid-stream, after its first windows.
    set_policy(cp, "--judges", "judge", "--directions", "answers", "--fail", "closed",
               "--controversial", "safe")  # fmt: skip
    before = " ".join(f"safe{i}" for i in range(60))
    after = " ".join(f"tail{i}" for i in range(200))
    with httpx.Client(base_url=cp.url, timeout=30) as http, http.stream(
        "POST", "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
        json={"model": "chat", "stream": True,
              "messages": [{"role": "user", "content": f"/echo {before} UNSAFE-MARKER {after}"}]},
    ) as resp:  # fmt: skip
        raw = resp.read().decode()
        answer_id = resp.headers["x-request-id"]
    assert resp.status_code == 200 and streamed_text(raw) and "UNSAFE" not in raw
    assert "content_filter" in raw

    # 2. Requests judged too: the client is refused, and holds the answer's request id.
    set_policy(cp, "--judges", "judge", "--directions", "requests", "answers",
               "--fail", "closed", "--controversial", "safe")  # fmt: skip
    wait_for(lambda: _refused_as_filter(api, "UNSAFE-MARKER please"), 10, "requests judged")
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "UNSAFE-MARKER please"}]
        )
    assert caught.value.code == "content_filter"
    request_id = caught.value.response.headers["x-request-id"]
    assert request_id.startswith("req_") and caught.value.request_id == request_id

    # 3. The operator: from Traffic to Refusals, the id pasted into the filter.
    page = console(operator, "/gateway/traffic/")
    page.click("#refusals-link")
    page.wait_for_url(cp.url + "/gateway/refusals/")
    row = find_in_console(page, cp.url, request_id)
    assert row.locator("[data-role=direction]").inner_text() == "request"
    assert row.locator("[data-role=judge]").inner_text() == "judge"
    assert row.locator("[data-role=key]").inner_text() == "support-bot"
    assert row.locator("[data-role=model]").inner_text() == "chat"
    assert row.locator("[data-role=categories]").inner_text() != "—"
    assert page.locator("#refusals tbody tr").count() == 1  # that one only
    assert "UNSAFE-MARKER" not in page.content()  # never the text
    streamed = find_in_console(page, cp.url, answer_id)
    assert streamed.locator("[data-role=direction]").inner_text() == "answer"

    # 4. The same through the API, with a viewer's token.
    _, token = ApiToken.issue(viewer, "ops")
    listed = httpx.get(cp.url + "/api/v1/gateway/refusals/", params={"request_id": request_id},
                       headers={"Authorization": f"Bearer {token}"}).json()  # fmt: skip
    assert [(r["request_id"], r["direction"], r["key"], r["owner"], r["judge"], r["judged"])
            for r in listed["results"]] == [
        (request_id, "request", "support-bot", "team:support", "judge", True)]  # fmt: skip
    answers = httpx.get(cp.url + "/api/v1/gateway/refusals/",
                        params={"key": "support-bot", "direction": "answer"},
                        headers={"Authorization": f"Bearer {token}"}).json()  # fmt: skip
    assert [r["request_id"] for r in answers["results"]] == [answer_id]
    bad = httpx.get(cp.url + "/api/v1/gateway/refusals/", params={"direction": "sideways"},
                    headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "direction"

    # 5. A viewer's chat: the refused answer names its request id, linked to the record.
    chat = console(viewer, "/gateway/chat/")
    chat.fill("#chat-message", "/echo fine words then UNSAFE-MARKER")
    chat.click("#chat-send")
    refusal = chat.locator(".chatline.refusal").last
    wait_for(lambda: refusal.count() and refusal.get_attribute("data-request-id"), 30,
             "the chat's refusal")  # fmt: skip
    chat_id = refusal.get_attribute("data-request-id")
    assert chat_id.startswith("req_") and chat_id in refusal.inner_text()
    assert "judge 'judge'" in refusal.inner_text()
    wait_for(lambda: Refusal.objects.filter(request_id=chat_id).exists(), 20, "the chat's record")
    refusal.locator("a").click()
    chat.wait_for_url(f"{cp.url}/gateway/refusals/?request_id={chat_id}")
    found = chat.locator(f'#refusals tr[data-request-id="{chat_id}"]')
    assert found.count() == 1 and found.locator("[data-role=key]").inner_text() == "console:vera"

    # 6. A gateway process of its own (manage.py gateway serve) records its refusals too.
    with gateway_process(cp, tmp_path) as url:
        alone = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            alone.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "UNSAFE-MARKER again"}]
            )
        alone_id = caught.value.response.headers["x-request-id"]
        wait_for(lambda: Refusal.objects.filter(request_id=alone_id, key="support-bot").exists(),
                 20, "the gateway process's record")  # fmt: skip

    # Every refusal was recorded once, by the id its client got.
    assert {request_id, answer_id, chat_id} <= set(
        Refusal.objects.values_list("request_id", flat=True)
    )
    assert not Refusal.objects.filter(request_id__in=[request_id, answer_id]).exclude(
        key="support-bot").exists()  # fmt: skip
