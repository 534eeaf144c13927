"""Anthropic's Messages API through the real gateway: the official ``anthropic`` client
against the gateway (real uvicorn, its real table read from the database, the real guard
with a sim judge) in front of a real sim engine process, and of an engine told to say an
unsafe marker. The sim serves the Messages API natively (its answer normalized by the
gateway); the marked engine is translated to chat completions on the way, and back."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import anthropic
import httpx
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.path.guarding import Guard
from gateway.records.observe import Done
from gateway.records.state import State
from guard import records
from guard import services as guard_services
from tests.catalog.samples import sim_model, store
from tests.gateway.harness import Engine, Harness, wait
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

MARKER = "UNSAFE-MARKER"
WEATHER = {"name": "get_weather", "description": "the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}  # fmt: skip


@dataclass
class Served:
    gw: Harness
    secret: str
    engine: Engine  # the one told what to say (model "marked")

    def heard(self) -> Done:
        """The end of the request made since the last call, as the observers heard it
        (told just after its answer's last byte: waited for)."""
        observer = self.gw.gateway.observer
        done = wait(lambda: observer.last, 5, "the request's end heard")
        observer.last = None
        return done

    def client(self, **kw: object) -> anthropic.Anthropic:
        kw.setdefault("api_key", self.secret)
        return anthropic.Anthropic(base_url=self.gw.url, max_retries=0, timeout=30, **kw)


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[str, str]]:
    """A judge that refuses the marker, and a chat engine."""
    judge, judge_url = launch("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "0",
                              "--tps", "100000")  # fmt: skip
    chat, chat_url = launch("--model", "chat", "--ttft", "0", "--tps", "100000")
    yield judge_url, chat_url
    stop(judge)
    stop(chat)


def serving(sims: tuple[str, str], say: str, directions: tuple[str, ...]) -> Served:
    judge_url, chat_url = sims
    h = Harness(state=State(), guard=Guard())
    engine = h.engine("e", say=say)
    marked = engine.url
    guard_model("judge", endpoint=judge_url)
    for name, url in (("chat", chat_url), ("marked", marked)):
        store(sim_model(name, tp=None, capabilities={"tools": True}))
        Replica.objects.create(model_name=name, state="ready", endpoint=url, profile="sim")
    guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": list(directions),
                               "fail": "closed"}, surface="cli")  # fmt: skip
    _, secret = keys.create_key("k")
    records.start()
    h.serve([], [])
    # The sim process serves the dialects natively; the engine told what to say speaks
    # chat completions alone, so the operator's setting has its dialects translated.
    h.gateway.options.translate = frozenset({"marked"})
    return Served(h, secret, engine)


@pytest.fixture
def served(sims: tuple[str, str]) -> Iterator[Served]:
    s = serving(sims, f"one two {MARKER} three four", ("requests", "answers"))
    yield s
    s.gw.close()
    records.RECORDER.stop()


def test_messages_create_whole_and_streamed(served: Served) -> None:
    api = served.client()
    asked = [{"role": "user", "content": "Say something."}]
    message = api.messages.create(model="chat", max_tokens=16, messages=asked,
                                  system="You are terse.")  # fmt: skip
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 0
    assert message.usage.output_tokens > 0
    done = served.heard()
    assert (done.dialect, done.status, done.stream) == ("messages", 200, False)

    with api.messages.stream(model="chat", max_tokens=16, messages=asked) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(texts) == final.content[0].text and final.content[0].text
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.usage.output_tokens > 0
    done = served.heard()
    assert (done.dialect, done.stream, done.model) == ("messages", True, "chat")
    assert done.tokens_out == final.usage.output_tokens

    # The key in Authorization: Bearer works as well as in x-api-key.
    bearer = anthropic.Anthropic(base_url=served.gw.url, auth_token=served.secret,
                                 max_retries=0, timeout=30)  # fmt: skip
    assert bearer.messages.create(model="chat", max_tokens=4, messages=asked).content


@pytest.mark.parametrize("streamed", [False, True])
def test_tools_and_tool_results(served: Served, streamed: bool) -> None:
    api = served.client()
    asked = [{"role": "user", "content": '/call get_weather {"city": "Paris"}'}]
    if streamed:
        with api.messages.stream(model="chat", max_tokens=64, messages=asked,
                                 tools=[WEATHER]) as stream:  # fmt: skip
            message = stream.get_final_message()
    else:
        message = api.messages.create(model="chat", max_tokens=64, messages=asked,
                                      tools=[WEATHER])  # fmt: skip
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input == {"city": "Paris"}
    # The tool's result sent back: the engine answers in text.
    turn = [*asked, {"role": "assistant", "content": [b.model_dump() for b in message.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "18 degrees, sunny"}]}]  # fmt: skip
    after = api.messages.create(model="chat", max_tokens=16, messages=turn, tools=[WEATHER])
    assert after.stop_reason in ("end_turn", "max_tokens") and after.content[0].text


def test_count_tokens_is_the_engines_count_of_the_prompt(served: Served) -> None:
    api = served.client()
    asked = [{"role": "user", "content": "How many tokens is this prompt?"}]
    counted = api.messages.count_tokens(model="chat", messages=asked, system="Be brief.",
                                        tools=[WEATHER])  # fmt: skip
    assert counted.input_tokens > 0
    counting = served.heard()
    assert (counting.dialect, counting.status, counting.model) == ("count_tokens", 200, "chat")
    assert counting.tokens_in == 0  # counted, not read by a model: nothing for usage
    answered = api.messages.create(model="chat", max_tokens=2, messages=asked,
                                   system="Be brief.", tools=[WEATHER])  # fmt: skip
    usage = answered.usage
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens
    assert served.heard().dialect == "messages"
    with pytest.raises(anthropic.NotFoundError) as caught:
        api.messages.count_tokens(model="nope", messages=asked)
    assert caught.value.body["error"]["type"] == "not_found_error"


def test_errors_are_in_anthropics_shape(served: Served) -> None:
    asked = [{"role": "user", "content": "hi"}]
    with pytest.raises(anthropic.AuthenticationError) as caught:
        served.client(api_key="llmgw-ck-wrong").messages.create(model="chat", max_tokens=4,
                                                                messages=asked)  # fmt: skip
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "authentication_error"
    assert "x-api-key" in caught.value.body["error"]["message"]
    api = served.client()
    with pytest.raises(anthropic.NotFoundError) as caught:
        api.messages.create(model="nope", max_tokens=4, messages=asked)
    assert caught.value.body["error"]["type"] == "not_found_error"
    # A body the API would refuse: where and what, never a 500.
    r = httpx.post(served.gw.url + "/v1/messages", timeout=10,
                   headers={"x-api-key": served.secret, "anthropic-version": "2023-06-01"},
                   json={"model": "chat", "messages": asked})  # fmt: skip
    assert r.status_code == 400
    assert r.json()["type"] == "error"
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(served.gw.url + "/v1/messages", timeout=10, content=b"{not json",
                   headers={"x-api-key": served.secret})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(served.gw.url + "/v1/messages", headers={"x-api-key": served.secret})
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_a_refusal_midstream_ends_with_stop_reason_refusal(served: Served) -> None:
    api = served.client()
    asked = [{"role": "user", "content": "Say it."}]
    with api.messages.stream(model="marked", max_tokens=32, messages=asked) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert final.stop_reason == "refusal"
    shown = "".join(texts) + "".join(b.text for b in final.content if b.type == "text")
    assert "UNSAFE" not in shown and "MARKER" not in shown
    assert served.heard().dialect == "messages"
    # Whole: the answer is refused as chat's is, in Anthropic's shape.
    with pytest.raises(anthropic.BadRequestError) as caught:
        api.messages.create(model="marked", max_tokens=32, messages=asked)
    assert caught.value.body["error"]["details"]["error_code"] == "content_filter"
    assert MARKER not in str(caught.value.body)


@pytest.mark.parametrize("streamed", [False, True])
def test_a_refused_request_is_anthropics_error_streamed_or_not(
    served: Served, streamed: bool
) -> None:
    """The guard reads the system prompt, tool results and tools too; stream: true never
    changes the verdict."""
    api = served.client()
    for asked in (
        {"system": f"hide {MARKER}", "messages": [{"role": "user", "content": "hi"}]},
        {"messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1",
                                               "name": "get_weather", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                          "content": f"it is {MARKER}"}]},
        ], "tools": [WEATHER]},
    ):  # fmt: skip
        with pytest.raises(anthropic.BadRequestError) as caught:
            if streamed:
                with api.messages.stream(model="chat", max_tokens=8, **asked) as stream:
                    stream.get_final_message()
            else:
                api.messages.create(model="chat", max_tokens=8, **asked)
        body = caught.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["details"]["error_code"] == "content_filter"


@pytest.mark.parametrize("way", ["native", "translated"])
def test_messages_on_the_engines_own_route_or_translated(
    served: Served,
    sims: tuple[str, str],  # noqa: F811
    way: str,
) -> None:
    """The sim serves /v1/messages itself: the gateway sends it natively unless the
    operator has the model translated; the client reads the same either way."""
    if way == "translated":
        served.gw.gateway.options.translate = frozenset({"chat"})
    engine = sims[1]
    before = httpx.get(engine + "/sim/stats", timeout=5).json()["messages"]
    api = served.client()
    asked = [{"role": "user", "content": "/echo hello there END and more"}]
    system = "You answer in few words. " * 12  # a prefix of whole cache blocks
    message = api.messages.create(model="chat", max_tokens=32, messages=asked, system=system,
                                  stop_sequences=["END"])  # fmt: skip
    assert message.content[0].text == "hello there "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "END")
    assert message.id.startswith("msg_") and message.usage.output_tokens > 0
    with api.messages.stream(model="chat", max_tokens=32, messages=asked,
                             system=system) as stream:  # fmt: skip
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "hello there END and more" and final.stop_reason == "end_turn"
    # The same prompt again: the engine's prefix cache read it.
    assert final.usage.cache_read_input_tokens > 0
    assert final.usage.output_tokens > 0
    called = api.messages.create(
        model="chat", max_tokens=64, tools=[WEATHER],
        messages=[{"role": "user", "content": '/call get_weather {"city": "Oslo"}'}],
    )  # fmt: skip
    assert called.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in called.content if b.type == "tool_use"] == \
        [("get_weather", {"city": "Oslo"})]  # fmt: skip
    asked_native = httpx.get(engine + "/sim/stats", timeout=5).json()["messages"] - before
    assert asked_native == (3 if way == "native" else 0)
