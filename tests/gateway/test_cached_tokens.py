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

from cluster.models import Quota, Replica
from gateway import services as keys
from gateway.cacheshare import share, spared
from gateway.models import Usage
from gateway.path.limits import WINDOW, LocalLimits
from gateway.records import history
from gateway.records.observe import Fanout
from gateway.records.state import State
from gateway.records.usage import UsageRecorder
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Harness
from tests.guard.test_client import launch, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

SYSTEM = "You answer questions about the weather in full sentences. " * 20
OWNER = "team:weather"


@pytest.fixture(scope="module")
def sim() -> Iterator[str]:
    chat, chat_url = launch("--model", "chat", "--ttft", "0", "--tps", "100000")
    yield chat_url
    stop(chat)


NOW = 1_800_000_000.0  # one budget minute for the whole test
BUDGET = 1_000_000


def serving(sim: str, weight: float | None = None) -> tuple[Harness, str, UsageRecorder]:
    h = Harness(state=State())
    entry = sim_model("chat", tp=None)
    if weight is not None:
        entry["cached_token_weight"] = weight
    store(entry)
    Replica.objects.create(model_name="chat", state="ready", endpoint=sim, profile="sim")
    Quota.objects.create(owner=OWNER, tpm=BUDGET)
    _, secret = keys.create_key("weather-bot", owner=OWNER, tpm=BUDGET)
    recorder = UsageRecorder(interval=3600)  # written by stop(), read after
    h.gateway.observer = Fanout(recorder)
    h.gateway.limits = LocalLimits(clock=lambda: NOW)
    h.serve([], [])
    return h, secret, recorder


@pytest.fixture
def gw(sim: str) -> Iterator[tuple[Harness, str, UsageRecorder]]:
    served = serving(sim)
    yield served
    served[0].close()


def ended(h: Harness, n: int) -> None:
    """Wait until the gateway has told its observers of ``n`` requests and run what they
    left to do off the path (a budget's settle): read on its own loop, between steps."""

    async def now() -> bool:
        told = sum(h.gateway.observer.requests.values())
        return told >= n and not h.gateway.parts.background

    wait_until(lambda: h.run(now()), timeout=10, what=f"{n} requests to end")


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
    ended(h, 2)
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
    ended(h, 2)
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
    shown = history.charts_for(owner=OWNER, span="hour")[-1]
    assert shown.label == "cached share of tokens in (%)" and not shown.quiet
    points = history.usage_series(key="weather-bot", span="hour")
    assert sum(p.tokens_cached for p in points) == (first.prompt_tokens_details.cached_tokens
                                                   + second.prompt_tokens_details.cached_tokens)  # fmt: skip
    chart_page = web.get("/gateway/history/", {"owner": OWNER}).content.decode()
    assert "cached share of tokens in (%)" in chart_page
    unnamed = web.get("/gateway/cache/")
    assert unnamed.status_code == 400 and b"Name one of key, owner or model." in unnamed.content


@pytest.mark.parametrize("weight", [None, 0.25, 0.0])
def test_token_budgets_charge_cached_tokens_at_the_models_weight(
    sim: str, weight: float | None
) -> None:
    h, secret, _ = serving(sim, weight)
    try:
        api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=30)
        usages = two_turns(api, stream=False)
        limits = h.gateway.limits
        window = int(NOW // WINDOW)

        ended(h, 2)
        owner_count = limits._counts[(OWNER, "owner", window)]
    finally:
        h.close()
    fresh = sum(u.prompt_tokens + u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens or 0 for u in usages)
    assert cached > 0
    w = 1.0 if weight is None else weight
    assert owner_count == fresh - spared(cached, w)
    if w < 1:
        assert owner_count < fresh  # the cached tokens cost less


@pytest.mark.parametrize("stream", [False, True])
def test_responses_and_messages_second_turns_report_and_count_cached_tokens(
    gw: tuple[Harness, str, UsageRecorder], stream: bool
) -> None:
    import anthropic

    h, secret, recorder = gw
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=0, timeout=30)
    first = api.responses.create(model="chat", instructions="R. " + SYSTEM, input="Hello.",
                                 max_output_tokens=8)  # fmt: skip
    if stream:
        with api.responses.stream(model="chat", instructions="R. " + SYSTEM, input="Go on.",
                                  previous_response_id=first.id, max_output_tokens=8) as s:  # fmt: skip
            second = list(s)[-1].response  # cut by max_output_tokens: response.incomplete
    else:
        second = api.responses.create(model="chat", instructions="R. " + SYSTEM, input="Go on.",
                                      previous_response_id=first.id, max_output_tokens=8)  # fmt: skip
    responses_cached = second.usage.input_tokens_details.cached_tokens
    assert 0 < responses_cached < second.usage.input_tokens
    claude = anthropic.Anthropic(base_url=h.url, api_key=secret, max_retries=0, timeout=30)
    turn: list[Any] = [{"role": "user", "content": "Hello there."}]
    one = claude.messages.create(model="chat", max_tokens=8, system="M. " + SYSTEM,
                                 messages=turn)  # fmt: skip
    turn += [{"role": "assistant", "content": one.content[0].text},
             {"role": "user", "content": "Go on."}]  # fmt: skip
    if stream:
        with claude.messages.stream(model="chat", max_tokens=8, system="M. " + SYSTEM,
                                    messages=turn) as s:  # fmt: skip
            two = s.get_final_message()
    else:
        two = claude.messages.create(model="chat", max_tokens=8, system="M. " + SYSTEM,
                                     messages=turn)  # fmt: skip
    messages_cached = two.usage.cache_read_input_tokens
    assert messages_cached and messages_cached > 0
    ended(h, 4)
    recorder.stop()
    row = Usage.objects.filter(key="weather-bot").aggregate(c=Sum("tokens_cached"))
    cached_first = (first.usage.input_tokens_details.cached_tokens or 0) + (
        one.usage.cache_read_input_tokens or 0
    )
    assert row["c"] == cached_first + responses_cached + messages_cached
