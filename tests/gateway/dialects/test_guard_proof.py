"""The guard holds in every dialect, translated or native: an unsafe marker at a random
place in many streamed answers, through the real gateway and the real guard (a sim judge
that refuses the marker): not one character of it reaches the client, and every refused
stream ends with its dialect's own ending, read by the official client without an
exception. Translated: an engine told what to say, which speaks chat completions alone.
Native: a sim engine process serving /v1/responses and /v1/messages itself, told what to
say by ``/echo``; the gateway cuts its stream and writes the dialect's ending."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator

import httpx
import openai
import pytest

from cluster.models import Replica
from guard import records
from tests.catalog.samples import sim_model, store
from tests.gateway.dialects.test_gateway_messages import MARKER, Served, serving, sims  # noqa: F401
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

# Per dialect; LLMGW_GUARD_PROOF_ANSWERS=200 runs more (the figures are printed, -s).
ANSWERS = int(os.environ.get("LLMGW_GUARD_PROOF_ANSWERS") or 50)
WORDS = 80


@pytest.fixture(scope="module")
def paced() -> Iterator[str]:
    """A sim engine whose tokens come apart (so windows release text before the marker)."""
    proc, url = launch("--model", "paced", "--ttft", "0", "--tps", "1500")
    yield url
    stop(proc)


@pytest.fixture
def served(sims: tuple[str, str], paced: str) -> Iterator[Served]:  # noqa: F811
    store(sim_model("paced", tp=None))
    Replica.objects.create(model_name="paced", state="ready", endpoint=paced, profile="sim")
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


@pytest.mark.parametrize("way", ["translated", "native"])
@pytest.mark.parametrize("dialect", ["messages", "responses"])
def test_no_character_of_the_marker_reaches_the_client(
    served: Served, dialect: str, way: str
) -> None:
    rng = random.Random(f"guard-proof-{dialect}")
    # Translated: the marked engine (chat completions alone). Native: the paced sim, which
    # echoes what the request says after /echo (its own dialect route: engines.FIT).
    model, prefix = ("marked", "") if way == "translated" else ("paced", "/echo ")
    stats = _stats(served, way)
    anthropic_api = served.client()
    openai_api = openai.OpenAI(base_url=served.gw.url + "/v1", api_key=served.secret,
                               max_retries=0, timeout=30)  # fmt: skip
    released_some = 0
    for _ in range(ANSWERS):
        text, before = marked(rng)
        served.engine.say = text  # read per request
        asked = prefix + text if prefix else "go"
        if dialect == "messages":
            with anthropic_api.messages.stream(
                model=model, max_tokens=512, messages=[{"role": "user", "content": asked}]
            ) as stream:
                raw = "".join(stream.text_stream)
                final = stream.get_final_message()
            assert final.stop_reason == "refusal"
            shown = "".join(b.text for b in final.content if b.type == "text")
            assert shown == raw
        else:
            events = list(openai_api.responses.create(model=model, input=asked, stream=True))
            assert events[-1].type == "response.incomplete"
            assert events[-1].response.incomplete_details.reason == "content_filter"
            raw = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert events[-1].response.output_text == raw
        assert "UNSAFE" not in raw and "MARKER" not in raw
        # What was released is the answer's text before the marker, never past it.
        assert before.startswith(raw.rstrip())
        released_some += bool(raw)
    if way == "native":
        # Every answer was the engine's own dialect stream, none translated.
        assert _stats(served, way)[dialect] - stats[dialect] == ANSWERS
    print(f"\n{dialect} ({way}): {ANSWERS} streamed answers, each refused with its dialect's "  # noqa: T201
          f"ending, {released_some} after releasing the judged text before the marker, 0 "
          "characters of the marker released")  # fmt: skip
    # Refusals came midway, not only before the first byte.
    assert released_some >= ANSWERS // 4, released_some


def _stats(served: Served, way: str) -> dict[str, int]:
    """The paced sim's counts of requests its own dialect routes served."""
    if way != "native":
        return {"messages": 0, "responses": 0}
    url = Replica.objects.get(model_name="paced").endpoint
    return httpx.get(url + "/sim/stats", timeout=5).json()
