"""The guard holds in every dialect: an unsafe marker at a random place in many streamed
answers, through the real gateway and the real guard (a sim judge that refuses the
marker): not one character of it reaches the client, and every refused stream ends with
its dialect's own ending, read by the official client without an exception."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import openai
import pytest

from guard import records
from tests.gateway.dialects.test_gateway_messages import MARKER, Served, serving, sims  # noqa: F401

pytestmark = pytest.mark.django_db(transaction=True)

# Per dialect; LLMGW_GUARD_PROOF_ANSWERS=200 runs more (the figures are printed, -s).
ANSWERS = int(os.environ.get("LLMGW_GUARD_PROOF_ANSWERS") or 50)
WORDS = 80


@pytest.fixture
def served(sims: tuple[str, str]) -> Iterator[Served]:  # noqa: F811
    s = serving(sims, "unused", ("answers",))
    s.engine.pace = 0.002  # words come apart, so windows release text before the marker
    yield s
    s.gw.close()
    records.RECORDER.stop()


def marked(rng: random.Random) -> tuple[str, str]:
    """An answer of ``WORDS`` words with the marker at a random place, and its text
    before the marker."""
    words = [f"w{rng.randrange(1000)}" for _ in range(WORDS)]
    at = rng.randrange(WORDS)
    words.insert(at, MARKER)
    return " ".join(words), " ".join(words[:at])


@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_no_character_of_the_marker_reaches_the_client(served: Served, dialect: str) -> None:
    rng = random.Random(f"guard-proof-{dialect}")
    anthropic_api = served.client()
    openai_api = openai.OpenAI(base_url=served.gw.url + "/v1", api_key=served.secret,
                               max_retries=0, timeout=30)  # fmt: skip
    released_some = 0
    for _ in range(ANSWERS):
        text, before = marked(rng)
        served.engine.say = text  # read per request
        if dialect == "messages":
            with anthropic_api.messages.stream(
                model="marked", max_tokens=512, messages=[{"role": "user", "content": "go"}]
            ) as stream:
                raw = "".join(stream.text_stream)
                final = stream.get_final_message()
            assert final.stop_reason == "refusal"
            shown = "".join(b.text for b in final.content if b.type == "text")
            assert shown == raw
        else:
            events = list(openai_api.responses.create(model="marked", input="go", stream=True))
            assert events[-1].type == "response.incomplete"
            assert events[-1].response.incomplete_details.reason == "content_filter"
            raw = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert events[-1].response.output_text == raw
        assert "UNSAFE" not in raw and "MARKER" not in raw
        # What was released is the answer's text before the marker, never past it.
        assert before.startswith(raw.rstrip())
        released_some += bool(raw)
    print(f"\n{dialect}: {ANSWERS} streamed answers, each refused with its dialect's "  # noqa: T201
          f"ending, {released_some} after releasing the judged text before the marker, 0 "
          "characters of the marker released")  # fmt: skip
    # Refusals came midway, not only before the first byte.
    assert released_some >= ANSWERS // 4, released_some
