"""Cached prompt tokens through the real gateway: the official ``openai`` client against the
gateway (real uvicorn, its table read from the database) in front of a real sim engine
process, whose prefix cache serves a conversation's second turn. The engine's cached
tokens reach the client in chat's usage, the usage rows, and the Keys and owner pages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest
from django.db.models import Sum

from cluster.models import Replica
from gateway import services as keys
from gateway.cacheshare import share
from gateway.models import Usage
from gateway.observe import Fanout
from gateway.state import State
from gateway.usage import UsageRecorder
from tests.catalog.samples import store
from tests.gateway.harness import Harness
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You answer questions about the weather in full sentences. " * 20
OWNER = "team:weather"


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    chat, chat_url = launch("--model", "chat", "--ttft", "0", "--tps", "100000")
    yield chat_url
    stop(chat)


@pytest.fixture
def gw(sim: str) -> Iterator[tuple[Harness, str, UsageRecorder]]:
    h = Harness(state=State())
    store({"name": "chat", "source": "sim/chat", "scaling": {"min": 1, "max": 1},
           "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}]})  # fmt: skip
    Replica.objects.create(model_name="chat", state="ready", endpoint=sim, profile="sim")
    _, secret = keys.create_key("weather-bot", owner=OWNER)
    recorder = UsageRecorder(interval=3600)  # written by stop(), read after
    h.gateway.observer = Fanout(recorder)
    h.serve([], [])
    yield h, secret, recorder
    h.close()


def two_turns(api: openai.OpenAI, stream: bool) -> list[Any]:
    """Two turns of one conversation: the second resends the first's prompt."""
    turn: list[Any] = [{"role": "system", "content": SYSTEM},
                       {"role": "user", "content": "Is it raining in Paris?"}]  # fmt: skip
    first = api.chat.completions.create(model="chat", messages=turn, max_tokens=8)
    turn += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "And in Lyon?"}]  # fmt: skip
    if not stream:
        return [first.usage, api.chat.completions.create(model="chat", messages=turn,
                                                         max_tokens=8).usage]  # fmt: skip
    chunks = list(api.chat.completions.create(model="chat", messages=turn, max_tokens=8,
                                              stream=True,
                                              stream_options={"include_usage": True}))  # fmt: skip
    return [first.usage, chunks[-1].usage]


@pytest.mark.parametrize("stream", [False, True])
def test_a_second_turn_reports_cached_tokens_and_its_row_keeps_them(
    gw: tuple[Harness, str, UsageRecorder], stream: bool
) -> None:
    h, secret, recorder = gw
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    first, second = two_turns(api, stream)
    cached = second.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.prompt_tokens
    assert h.gateway.observer.last.tokens_cached == cached
    recorder.stop()
    row = Usage.objects.filter(key="weather-bot").aggregate(i=Sum("tokens_in"),
                                                             c=Sum("tokens_cached"))  # fmt: skip
    assert row["i"] == first.prompt_tokens + second.prompt_tokens
    assert row["c"] == (first.prompt_tokens_details.cached_tokens or 0) + cached


def test_the_keys_and_owner_pages_show_the_cache_hit_share(
    gw: tuple[Harness, str, UsageRecorder], viewer: Any, client_for: Any
) -> None:
    h, secret, recorder = gw
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    first, second = two_turns(api, stream=False)
    recorder.stop()
    percent = share(first.prompt_tokens + second.prompt_tokens,
                    first.prompt_tokens_details.cached_tokens
                    + second.prompt_tokens_details.cached_tokens)  # fmt: skip
    assert percent and percent > 0
    web = client_for(viewer)
    page = web.get("/gateway/keys/").content.decode()
    assert f"{percent} % cached</a>" in page and "?key=weather-bot" in page
    owner = web.get("/cluster/owners/team:weather/").content.decode()
    assert "/gateway/cache/?owner=team%3Aweather" in owner
    part = web.get("/gateway/cache/", {"owner": OWNER}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-model="chat"' in part and f"{percent} %" in part
    by_key = web.get("/gateway/cache/", {"key": "weather-bot"})
    assert by_key.status_code == 200 and f"{percent} %" in by_key.content.decode()
    unnamed = web.get("/gateway/cache/")
    assert unnamed.status_code == 400 and b"Name one of key, owner or model." in unnamed.content
