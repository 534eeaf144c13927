"""The dialects take chat's path whole: retries before the first byte,
a stream cut after it, the key's budgets and the model's limits, each said in the
dialect's own shape to the official clients (the gateway's real request path over real
sockets: tests/gateway/harness.py)."""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import openai
import pytest

from gateway.path.table import Key, digest
from tests.gateway.harness import KEY, Harness, model

ASKED = [{"role": "user", "content": "x"}]


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def claude(h: Harness) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=h.url, api_key=KEY, max_retries=0, timeout=10)


def oai(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_replica_is_retried_on_another_in_both_dialects(h: Harness, stream: bool) -> None:
    bad, good = h.engine("bad", behaviour="503"), h.engine("good", words=3)
    h.serve([model("m", routing_profile="least")], [(1, "m", bad), (2, "m", good)])
    for _ in range(3):
        if stream:
            with claude(h).messages.stream(model="m", max_tokens=8, messages=ASKED) as s:
                text = s.get_final_message().content[0].text
        else:
            text = claude(h).messages.create(model="m", max_tokens=8, messages=ASKED)
            text = text.content[0].text
        assert text == "good0 good1 good2"
        response = oai(h).responses.create(model="m", input="x", stream=stream, store=False)
        if stream:
            response = list(response)[-1].response
        assert response.output_text == "good0 good1 good2"
    assert bad.requests >= 1 and h.gateway.observer.retries.get("m", 0) >= 1


def test_a_stream_cut_after_its_first_byte_ends_in_the_dialects_error(h: Harness) -> None:
    cut = h.engine("cut", behaviour="cut", words=10)
    h.serve([model("m")], [(1, "m", cut)])
    with (
        pytest.raises(anthropic.APIStatusError) as caught,
        claude(h).messages.stream(model="m", max_tokens=32, messages=ASKED) as s,
    ):
        s.get_final_message()
    assert caught.value.body["error"]["type"] == "api_error"
    # The openai client reads the error event and the failed response that follows it.
    events = list(oai(h).responses.create(model="m", input="x", stream=True, store=False))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds
    assert kinds[-2:] == ["error", "response.failed"]
    assert events[-1].response.status == "failed"


def test_budgets_and_limits_are_said_in_each_dialects_shape(h: Harness) -> None:
    h.keys[digest(KEY)] = Key(1, "harness", "team:t", (), None, rpm=2)
    h.one_budget_minute()
    engine = h.engine("e", words=3)
    h.serve([model("m", max_output=64)], [(1, "m", engine)])
    with pytest.raises(anthropic.BadRequestError) as caught:
        claude(h).messages.create(model="m", max_tokens=100, messages=ASKED)
    assert "max_tokens" in caught.value.body["error"]["message"]
    with pytest.raises(openai.BadRequestError) as bad:
        oai(h).responses.create(model="m", input="x", max_output_tokens=100)
    assert bad.value.param == "max_output_tokens"
    # The key's requests a minute: the two above did not reach the budget; two more do.
    claude(h).messages.create(model="m", max_tokens=8, messages=ASKED)
    oai(h).responses.create(model="m", input="x", store=False)
    with pytest.raises(anthropic.RateLimitError) as limited:
        claude(h).messages.create(model="m", max_tokens=8, messages=ASKED)
    assert limited.value.body["error"]["type"] == "rate_limit_error"
    assert limited.value.response.headers["retry-after"]
    with pytest.raises(openai.RateLimitError):
        oai(h).responses.create(model="m", input="x", store=False)


def test_an_engines_event_that_is_not_json_reaches_the_client_as_text(h: Harness) -> None:
    """Chat passes such an event on as it came; a dialect's client would choke on a line
    that is not its event, so it is the dialect's text (judged as text under a guard)."""
    garbled = h.engine("g", behaviour="garbled", words=3)
    h.serve([model("m")], [(1, "m", garbled)])
    with claude(h).messages.stream(model="m", max_tokens=8, messages=ASKED) as s:
        message = s.get_final_message()
    assert message.content[0].text == "{garbled g0{garbled g1{garbled g2"
    events = list(oai(h).responses.create(model="m", input="x", stream=True, store=False))
    assert events[-1].response.output_text == "{garbled g0{garbled g1{garbled g2"
