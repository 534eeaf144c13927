"""What the gateway reads of a body, through the real gateway: completions' token ids
reach the engine, and a model that is not a string is told what to send."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.gateway.harness import KEY, Harness, model


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2], [3]]])
def test_a_prompt_of_token_ids_reaches_the_engine(h: Harness, prompt: list) -> None:
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    client.completions.create(model="m", prompt=prompt, max_tokens=4)
    assert engine.bodies[-1]["prompt"] == prompt


def test_a_model_that_is_not_a_string_is_told_to_be_one(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    r = httpx.post(h.url + "/v1/chat/completions", timeout=10,
                   headers={"Authorization": f"Bearer {KEY}"},
                   json={"model": 5, "messages": [{"role": "user", "content": "x"}]})  # fmt: skip
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "model"
    assert error["message"].startswith("model must be a string naming a model")
