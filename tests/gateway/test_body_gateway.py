"""What the gateway reads of a body, through the real gateway: completions' token ids
reach the engine (and count exactly against the context), a model that is not a string
is told what to send, NaN is not JSON, functions need the tools capability, and an
engine's own error reaches the client in OpenAI's shape."""

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


def post(h: Harness, path: str, body: bytes | dict) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    content = body if isinstance(body, bytes) else None
    return httpx.post(h.url + path, timeout=10, headers=headers, content=content,
                      json=None if content is not None else body)  # fmt: skip


def test_nan_is_not_json_and_is_refused_before_any_engine(h: Harness) -> None:
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    r = post(h, "/v1/chat/completions",
             b'{"model": "m", "temperature": NaN, "messages": [{"role": "user", "content": "x"}]}')  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    assert engine.requests == 0


def test_functions_need_a_model_that_takes_tools(h: Harness) -> None:
    engine = h.engine("e")
    h.serve([model("m")], [(1, "m", engine)])
    r = post(h, "/v1/chat/completions", {
        "model": "m", "messages": [{"role": "user", "content": "x"}],
        "functions": [{"name": "f", "parameters": {"type": "object"}}]})  # fmt: skip
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "model_not_supported"
    assert r.json()["error"]["param"] == "functions"
    assert engine.requests == 0


def test_token_ids_count_exactly_against_the_context(h: Harness) -> None:
    engine = h.engine("e")
    h.serve([model("m", context_length=8)], [(1, "m", engine)])
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    client.completions.create(model="m", prompt=[1, 2, 3, 4], max_tokens=4)  # 8: fits
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt=[1, 2, 3, 4, 5], max_tokens=4)
    assert caught.value.code == "context_length_exceeded"
    assert engine.requests == 1


def test_an_engines_own_error_reaches_the_client_in_openais_shape(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e", behaviour="400"))])
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="m", n=2, messages=[{"role": "user", "content": "x"}])
    error = caught.value.body
    assert error == {"message": "Only n=1 is supported", "type": "BadRequestError",
                     "param": None, "code": None}  # fmt: skip


@pytest.mark.parametrize(("method", "path", "allow"), [
    ("POST", "/v1/models", "GET"), ("DELETE", "/v1/models/m", "GET"),
    ("GET", "/v1/chat/completions", "POST"),
])  # fmt: skip
def test_a_wrong_method_is_405_saying_which_one(
    h: Harness, method: str, path: str, allow: str
) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])
    r = httpx.request(method, h.url + path, headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert r.status_code == 405 and r.headers["allow"] == allow
    assert r.json()["error"]["message"] == f"{path} takes {allow}"
