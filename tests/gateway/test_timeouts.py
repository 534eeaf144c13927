"""Each model's own waits on the data path (catalog.timeouts), over real sockets: a whole
answer may take longer than a stream's first token, a model with a slow first token per
its slo is waited for, one without is given up on and the replica's request cancelled,
and a stream that falls silent ends with an error naming the wait."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from catalog import spec
from tests.gateway.harness import KEY, Harness, model, wait

S = 10**9


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    # The settings' waits, for models whose catalog entry gives no slo: short, so a test
    # sees them run out.
    options = harness.gateway.options
    options.first_byte_timeout, options.read_timeout, options.whole_timeout = 0.5, 0.5, 10
    yield harness
    harness.close()


def api(h: Harness) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def streamed(h: Harness, name: str) -> str:
    parts = []
    for chunk in api(h).chat.completions.create(
        model=name, stream=True, messages=[{"role": "user", "content": "hi"}]
    ):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    return "".join(parts)


def test_a_whole_answer_may_take_longer_than_a_streams_first_token(h: Harness) -> None:
    """It comes after its last token: a first-token wait cut off every whole answer that
    took longer to generate, and retried it on the next replica to fail the same way."""
    engine = h.engine("e", delay=1.5)
    h.serve([model("m")], [(1, "m", engine)])
    answer = api(h).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert answer.choices[0].message.content == "e0 e1 e2 e3 e4"
    assert engine.requests == 1  # not tried twice


def test_a_model_is_waited_for_as_long_as_its_slo_says(h: Harness) -> None:
    """Two models, the same slow first token (1.5 s after the role): the one whose slo
    says its first token takes up to 4 s is waited for (40 s); the one that says nothing
    is given up on at the gateway's 0.5 s on both replicas, each cancelled, and the
    client's error names the wait."""
    slow = [h.engine(f"slow{i}", first_token_delay=1.5) for i in range(3)]
    patient = model("patient", slo=spec.SLO(ttft_p99=4 * S))
    h.serve([patient, model("plain")],
            [(1, "patient", slow[0]), (2, "plain", slow[1]), (3, "plain", slow[2])])  # fmt: skip
    assert streamed(h, "patient") == "slow00 slow01 slow02 slow03 slow04"
    with pytest.raises(openai.APIStatusError) as failed:
        streamed(h, "plain")
    assert failed.value.status_code == 502
    assert "no first token within 0.5 s" in failed.value.message
    assert slow[1].requests == slow[2].requests == 1  # each replica tried once
    wait(lambda: slow[1].cancelled == slow[2].cancelled == 1, what="both engines cancelled")
    assert slow[0].cancelled == 0


def test_the_role_chunk_is_not_the_first_token(h: Harness) -> None:
    """Engines may send the role before the first token: the time to first token the
    gateway measures (and a canary is judged by) is to the token."""
    engine = h.engine("e", first_token_delay=0.3)
    h.serve([model("m", slo=spec.SLO(ttft_p99=1 * S))], [(1, "m", engine)])
    assert streamed(h, "m") == "e0 e1 e2 e3 e4"
    done = wait(lambda: h.gateway.observer.last, what="the request's record")
    assert done.ttft is not None and done.ttft >= 0.3


def test_a_stream_that_falls_silent_ends_with_an_error_naming_the_wait(h: Harness) -> None:
    engine = h.engine("e", behaviour="stall", first_token_delay=3)
    h.serve([model("m")], [(1, "m", engine)])
    with httpx.Client(timeout=30) as client:
        body = client.post(h.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                           json={"model": "m", "stream": True,
                                 "messages": [{"role": "user", "content": "x"}]}).text  # fmt: skip
    events = [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]
    assert json.loads(events[0])["choices"][0]["delta"]["content"] == "e0"
    error = json.loads(events[-2])["error"]
    assert error["message"] == "the engine's stream failed: the engine sent nothing for 0.5 s"
    assert events[-1] == "[DONE]"
    wait(lambda: engine.cancelled == 1, what="the engine cancelled")


def test_a_whole_answer_past_its_models_wait_moves_to_another_replica(h: Harness) -> None:
    """A replica that has not answered within the whole answer's wait (here the
    settings', cut to 1 s: the model gives no slo) is given up on, and another answers."""
    h.gateway.options.whole_timeout = 1.0
    hung, good = h.engine("hung", delay=5), h.engine("good")
    h.serve([model("m")], [(1, "m", hung), (2, "m", good)])
    for _ in range(4):  # whichever replica is picked first, the answer is the good one's
        answer = api(h).chat.completions.create(
            model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}])  # fmt: skip
        assert answer.choices[0].message.content == "good0 good1 good2 good3 good4"
