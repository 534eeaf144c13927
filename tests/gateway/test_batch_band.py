"""A batch's lines through the real gateway (``gateway.path.app``, uvicorn, the ``openai``
client): sent with the batch credential of a high-band key, they are that key (its scope,
its name) in the batch band below every key's, held while the model is past its slo when the key itself
is answered (its own slow answers do not put the model past it); a forged or revoked credential or one past its batch's window is refused 401."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from catalog import spec
from gateway.batch import token
from gateway.path.admission import Admission, Counts
from gateway.path.table import Key, digest
from tests.gateway.harness import KEY, Harness, model, wait

HIGH = "llmgw-ck-batch-high-key"
LOW = "llmgw-ck-batch-low-key"


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.keys[digest(HIGH)] = Key(3, "prod", "team:t", (), None, priority="high")
    harness.keys[digest(LOW)] = Key(4, "backfill", "team:t", (), None, priority="low")
    yield harness
    harness.close()


def ask(h: Harness, secret: str) -> str:
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=15)
    answer = api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return answer.choices[0].message.content or ""


def test_a_batch_line_is_its_key_in_the_lowest_band(h: Harness) -> None:
    h.gateway.admission = Admission(window=3.0, queue=0.2, counts=Counts())
    engine = h.engine("e", delay=0.6)  # 600 ms to the answer, slo 300 ms
    h.serve([model("m", slo=spec.SLO(ttft_p99=300_000_000))], [(1, "m", engine)])
    line = token.make(digest(HIGH), "batch_abc", int(time.time()) + 3600)
    assert ask(h, line)  # the key's own scope: answered while the model is within its slo
    # A batch line's own slow answer is no client's wait: the model is not past its slo.
    assert ask(h, line)
    assert ask(h, HIGH)  # a client's slow answer: now past the slo
    with pytest.raises(openai.RateLimitError) as caught:
        ask(h, line)  # past the slo: held as the low band, though its key is high
    assert "batch lines" in caught.value.body["message"]  # type: ignore[index]
    assert ask(h, HIGH)  # the key itself still answered
    for forged in (
        line[:-4] + "0000",
        token.make(digest("llmgw-ck-gone"), "batch_abc", int(time.time()) + 3600),
        token.make(digest(HIGH), "batch_abc", int(time.time()) - 1),
    ):
        with pytest.raises(openai.AuthenticationError):
            ask(h, forged)


def test_past_the_slo_a_batch_line_waits_while_a_normal_request_is_admitted(h: Harness) -> None:
    """The batch yields entirely before a live band is capped: when a client's slow answer
    puts the model past its slo while two batch lines are in flight, a normal key's next
    request goes in at once (the lines in flight do not take its room) while a batch line
    waits at the door and is then told to go again (429, in a second)."""
    counts = Counts()
    h.gateway.admission = Admission(window=5.0, queue=0.3, counts=counts)
    engine = h.engine("e", delay=1.0)  # a second to the answer, slo 300 ms
    h.serve([model("m", slo=spec.SLO(ttft_p99=300_000_000))], [(1, "m", engine)])
    line = token.make(digest(HIGH), "batch_abc", int(time.time()) + 3600)
    a = h.gateway.admission
    with ThreadPoolExecutor(4) as pool:
        live = pool.submit(ask, h, KEY)
        wait(lambda: a.state().get("m", {}).get("busy") == 1, what="the client in flight")
        lines = [pool.submit(ask, h, line) for _ in range(2)]
        wait(lambda: a.state()["m"]["busy"] == 3, what="two batch lines in flight beside it")
        assert live.result(timeout=15)  # its slow answer: the model is past its slo
        assert ask(h, KEY)  # admitted at once, the batch lines still in flight
        for done in lines:
            assert done.result(timeout=15)
        with pytest.raises(openai.RateLimitError) as caught:
            ask(h, line)  # a batch line waits at the door, then is told to go again
    assert "batch lines" in caught.value.body["message"]  # type: ignore[index]
    assert caught.value.response.headers["retry-after"] == "1"
    taken = counts.take(2**40)
    normal = [sum(b.get("normal", [0, 0])[i] for s in taken.values() for b in s.values())
              for i in (0, 1)]  # fmt: skip
    batch = [sum(b.get("batch", [0, 0])[i] for s in taken.values() for b in s.values())
             for i in (0, 1)]  # fmt: skip
    assert normal == [2, 0] and batch == [2, 1]  # no normal request held; the line was


def test_a_low_request_is_served_ahead_of_batch_lines_waiting_at_the_door(h: Harness) -> None:
    """Past the slo the live lower bands are capped and the batch is at 0: two batch lines
    wait at the door, filling its queue (``queue_max`` 2). A ``low`` key's request then
    still waits for its room rather than being refused at once, is answered once nothing
    live has run for a step, and the batch lines, waiting since before it, are told to go
    again (429) without having reached the engine."""
    h.gateway.admission = Admission(window=5.0, queue=3.0, queue_max=2, counts=Counts())
    engine = h.engine("e", delay=0.6)  # 600 ms to the answer, slo 300 ms
    h.serve([model("m", slo=spec.SLO(ttft_p99=300_000_000))], [(1, "m", engine)])
    line = token.make(digest(HIGH), "batch_abc", int(time.time()) + 3600)
    a = h.gateway.admission
    assert ask(h, HIGH)  # a client's slow answer: the model is past its slo
    with ThreadPoolExecutor(3) as pool:
        lines = [pool.submit(ask, h, line) for _ in range(2)]
        wait(lambda: a.state()["m"]["waiting"] == 2, what="two batch lines at the door")
        low = pool.submit(ask, h, LOW)
        assert low.result(timeout=15)  # waited for its room, then answered
        for held in lines:
            with pytest.raises(openai.RateLimitError):
                held.result(timeout=15)
    assert engine.requests == 2  # the high request and the low one: no batch line
