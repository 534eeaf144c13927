"""Admission through the real gateway (``gateway.path.app``, uvicorn, the ``openai`` client):
while the model is past its slo and the lower bands use their allowance, a low key waits and
is refused 429 with ``Retry-After``, ``x-should-retry`` and a reason naming its band and
the slo; a high key is answered; once the answers are fast again, the low key is back."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from catalog import spec
from gateway.path.admission import Admission, Counts
from gateway.path.table import Key, digest
from tests.gateway.harness import KEY, Harness, model, wait

LOW = "llmgw-ck-admission-low-key"
HIGH = "llmgw-ck-admission-high-key"


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.keys[digest(LOW)] = Key(2, "batch", "team:t", (), None, priority="low")
    harness.keys[digest(HIGH)] = Key(3, "prod", "team:t", (), None, priority="high")
    yield harness
    harness.close()


def client(h: Harness, secret: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=15)


def ask(h: Harness, secret: str) -> str:
    answer = client(h, secret).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    return answer.choices[0].message.content or ""


def test_a_low_band_is_held_while_the_model_is_past_its_slo_and_back_after_a_window(
    h: Harness,
) -> None:
    counts = Counts()
    h.gateway.admission = Admission(window=3.0, queue=0.2, counts=counts)
    engine = h.engine("e", delay=0.6)  # 600 ms to the answer, slo 300 ms
    h.serve([model("m", slo=spec.SLO(ttft_p99=300_000_000))], [(1, "m", engine)])
    assert ask(h, KEY)  # a normal key: within its slo until p99 is seen past it
    assert ask(h, HIGH)
    with pytest.raises(openai.RateLimitError) as caught:
        ask(h, LOW)
    refused = caught.value.response
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "3"
    assert refused.headers["x-should-retry"] == "true"
    message = caught.value.body["message"]  # type: ignore[index]
    assert "'low' band" in message and "slo 300 ms" in message and "TTFT p99 750 ms" in message
    assert caught.value.body["code"] == "held_for_slo"  # type: ignore[index]
    assert ask(h, HIGH)  # the top band is always answered
    # The model is fast again: once the last answers are fast, the low band is let in.
    engine.delay = 0.0

    def low_answered() -> bool:
        try:
            return bool(ask(h, LOW))
        except openai.RateLimitError:
            ask(h, HIGH)  # fast answers: room to grow
            return False

    wait(low_answered, timeout=10, what="the low band admitted again")
    # Every admitted request left the in-flight counts when it ended.
    a = h.gateway.admission
    wait(lambda: a.state()["m"]["busy"] == 0, what="nothing in flight")
    assert a.state()["m"]["lower"] == 0
    taken = counts.take(2**40)
    held = sum(b.get("low", [0, 0])[1] for s in taken.values() for b in s.values())
    high = sum(b.get("high", [0, 0])[0] for s in taken.values() for b in s.values())
    assert held >= 1 and high >= 2


def test_a_model_with_no_slo_holds_no_band(h: Harness) -> None:
    h.gateway.admission = Admission(window=1.0, queue=0.2, counts=Counts())
    h.serve([model("m")], [(1, "m", h.engine("e", delay=0.3))])
    for _ in range(3):
        assert ask(h, LOW)
