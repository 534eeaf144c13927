"""The gateway carries each replica's engine key on every call to it.

Through the real ``Gateway`` (tests/gateway/harness.py) with the official openai client:
each replica's engine sees its own key (cluster.enginekeys) on every request, streamed or
not; a real sim engine started with its replica's key answers, and one holding another
key answers 401, which the gateway takes as that replica failing (the client is never
told its own key is wrong); a caller's own Authorization (an external provider's) is
never replaced.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from cluster.enginekeys import engine_key
from llmgw_core.upstream import Upstream
from tests.agent.test_sim import launch
from tests.gateway.harness import KEY, Harness, model


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def api(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


def chat(h: Harness, text: str = "hi", stream: bool = False) -> str:
    messages: Any = [{"role": "user", "content": text}]
    if stream:
        parts = api(h).chat.completions.create(model="m", messages=messages, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    answer = api(h).chat.completions.create(model="m", messages=messages)
    return answer.choices[0].message.content or ""


def test_each_replica_is_called_with_its_own_engine_key(h: Harness) -> None:
    one, two = h.engine("one"), h.engine("two")
    h.serve([model("m")], [(11, "m", one), (12, "m", two)])
    for i in range(12):
        chat(h, f"question {i}", stream=i % 2 == 0)
    assert one.requests and two.requests
    assert set(one.auth) == {f"Bearer {engine_key(11)}"}
    assert set(two.auth) == {f"Bearer {engine_key(12)}"}


def test_a_sim_engine_answers_for_its_key_and_one_on_another_key_is_skipped(h: Harness) -> None:
    good = launch("--model", "m", "--ttft", "0", env={"LLMGW_SIM_API_KEY": engine_key(1)})
    stale = launch("--model", "m", "--ttft", "0", env={"LLMGW_SIM_API_KEY": "llmgw_engine_old"})
    try:
        h.serve([model("m")], [(2, "m", stale)])  # type: ignore[list-item]
        # Its engine refuses the gateway's key: no replica answered (502), never a 401
        # that would tell the client its own key is wrong.
        with pytest.raises(openai.APIStatusError) as failed:
            chat(h, "/echo x")
        assert failed.value.status_code == 502 and "HTTP 401" in failed.value.message
        h.serve([model("m")], [(1, "m", good), (2, "m", stale)])  # type: ignore[list-item]
        for i in range(8):
            assert chat(h, f"/echo answer {i}", stream=i % 2 == 1) == f"answer {i}"
        # Refusing every request it is asked, it is ejected as a replica answering 5xx is
        # (it was never counted as failing, so it was tried again on every pick).
        for i in range(40):
            if h.gateway.outliers.excluded((1, 2)):
                break
            assert chat(h, f"/echo more {i}") == f"more {i}"
        assert h.gateway.outliers.excluded((1, 2)) == {2}
    finally:
        good.stop()
        stale.stop()


def test_a_callers_own_authorization_is_never_replaced(h: Harness) -> None:
    provider = h.engine("provider")
    upstream = Upstream(credentials=lambda where: "llmgw_engine_not-for-a-provider")

    async def ask(headers: list[tuple[str, str]]) -> None:
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
        resp = await upstream.request(
            "POST", provider.url + "/v1/chat/completions", body,
            [("Content-Type", "application/json"), *headers],
        )  # fmt: skip
        await resp.read()

    h.run(ask([("Authorization", "Bearer sk-provider")]))
    h.run(ask([]))
    assert provider.auth == ["Bearer sk-provider", "Bearer llmgw_engine_not-for-a-provider"]
    upstream.close()
