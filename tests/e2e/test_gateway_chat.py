"""The console's chat page as a user meets it: real Chromium against a
real ``manage.py serve``, a real agent and sim engines. A viewer picks a model (judges
are not offered), the answer streams through the gateway and its guard with the session
(no key in the page), naming the replica that answered, the time to the first token and
tokens per second; an unsafe answer is refused, naming the judge and its categories. The
route refuses a post without the session's CSRF token, and anyone not signed in."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from cluster.models import Node, Replica
from llmgw_core.models import ApiToken
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import H100, ready, set_policy, sim_model

pytestmark = pytest.mark.e2e


def test_a_viewer_chats_through_the_gateway_and_sees_a_refusal(
    control_plane: ControlPlane, agents: Callable[..., Agent], console: Callable[..., Any],
    viewer: Any,
) -> None:  # fmt: skip
    # Four chat requests a minute per user: the page's two, then two of the route's own.
    control_plane.extra["LLMGW_CHAT_RPM"] = "4"
    control_plane.restart()
    agents("chat-node", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("talk"), sim_model("judge", role="guard", guard={"format": "qwen3guard"}))
    wait_for(ready("talk"), 90, "the chat model ready")
    wait_for(ready("judge"), 90, "the judge ready")
    set_policy(control_plane, "--judges", "judge", "--directions", "answers",
               "--fail", "closed", "--controversial", "safe")  # fmt: skip
    replica = Replica.objects.get(model_name="talk", desired=True, state="ready")

    page = console(viewer, "/gateway/chat/")
    offered = page.locator("#chat-model option").all_inner_texts()
    assert offered == ["talk"]  # never the judge
    assert "llmgw-ck-" not in page.content()

    # Budgets are counted in the minutes of the clock (gateway/path/limits.py): the one the
    # page's first chat is counted in.
    minute = int(time.time() // 60)
    page.fill("#chat-message", "/echo hello through the gateway")
    page.click("#chat-send")
    answer = page.locator(".chatline.assistant .text").last
    wait_for(lambda: answer.inner_text() == "hello through the gateway", 30, "the answer")
    stats = page.locator("#chat-stats")
    wait_for(lambda: "tokens/s" in stats.inner_text(), 10, "the stats")
    text = stats.inner_text()
    assert f"talk/sim #{replica.pk} on chat-node" in text and "TTFT" in text
    assert page.locator(".chatline.assistant").last.get_attribute("data-replica") == str(replica.pk)

    page.fill("#chat-message", "/echo fine words then UNSAFE-MARKER")
    page.click("#chat-send")
    refusal = page.locator(".chatline.refusal").last
    wait_for(lambda: refusal.count() and "judge 'judge'" in refusal.inner_text(), 30,
             "the refusal")  # fmt: skip
    assert "found it unsafe (" in refusal.inner_text()
    assert "UNSAFE-MARKER" not in page.locator(".chatline.assistant").last.inner_text()

    # The route: a session's post without its CSRF token, and no session at all.
    cookies = {c["name"]: c["value"] for c in page.context.cookies()}
    body = {"model": "talk", "messages": [{"role": "user", "content": "hi"}]}
    url = control_plane.url + "/console/chat/v1/chat/completions"
    no_csrf = httpx.post(url, json=body, cookies={"sessionid": cookies["sessionid"]})
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.json()["error"]["message"]
    csrf = cookies["csrftoken"]
    anonymous = httpx.post(url, json=body, cookies={"csrftoken": csrf},
                           headers={"X-CSRFToken": csrf})  # fmt: skip
    assert anonymous.status_code == 401
    nothing = httpx.post(url, json=body)  # no session, no token: told to sign in
    assert nothing.status_code == 401 and "sign in" in nothing.json()["error"]["message"]
    judged = httpx.post(url, json={**body, "model": "judge"}, cookies=cookies,
                        headers={"X-CSRFToken": csrf})  # fmt: skip
    assert judged.status_code == 404  # a judge is refused to the chat as to every key

    # The user's budget: two more answered, then 429 with when to try again.
    def post() -> httpx.Response:
        return httpx.post(url, json=body, cookies=cookies, headers={"X-CSRFToken": csrf})

    answers = [post() for _ in range(3)]
    if int(time.time() // 60) != minute:
        # A minute ended since the page's first chat, and the count began again: the
        # next minute's whole budget, then 429.
        now = int(time.time() // 60)
        wait_for(lambda: int(time.time() // 60) != now, 61, "the next minute")
        answers = [post() for _ in range(5)]
    *answered, limited = answers
    assert [a.status_code for a in answered] == [200] * len(answered), answered[-1].text
    assert limited.status_code == 429 and int(limited.headers["retry-after"]) >= 1
    message = limited.json()["error"]["message"]
    assert message.startswith(
        f"Rate limit reached for console:{viewer.username} (4 requests a minute)"
    )

    # /metrics tells the chat's traffic (owner console), the refusal and the judge's time.
    _, token = ApiToken.issue(viewer, "prometheus")
    scraped = httpx.get(control_plane.url + "/metrics",
                        headers={"Authorization": f"Bearer {token}"}).text  # fmt: skip
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(scraped) for s in f.samples}  # fmt: skip
    ok = ("llmgw_gateway_requests_total",
          (("model", "talk"), ("owner", "console"), ("status", "200")))  # fmt: skip
    assert samples[ok] >= 1
    assert any(n == "llmgw_gateway_refusals_total" and ("direction", "answer") in labels and v >= 1
               for (n, labels), v in samples.items())  # fmt: skip
    assert samples[("llmgw_guard_judge_seconds_count", (("judge", "judge"),))] >= 1
