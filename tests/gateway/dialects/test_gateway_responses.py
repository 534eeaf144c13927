"""OpenAI's Responses API through the real gateway: the official ``openai`` client against
the gateway (real uvicorn, its table read from the database, the real guard with a sim
judge) in front of a real sim engine process, and of an engine told to say an unsafe
marker. The sim serves the Responses API natively (its answer normalized by the
gateway); the marked engine is translated to chat completions on the way, and back;
stored responses in the database, continued by ``previous_response_id`` from another
gateway."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Iterator

import httpx
import openai
import pytest
from django.utils import timezone

from gateway import services as keys
from gateway import stored, tasks
from gateway.models import StoredResponse
from gateway.records.state import State
from guard import records
from tests.gateway.dialects.test_gateway_messages import MARKER, Served, serving, sims  # noqa: F401
from tests.gateway.harness import Harness, wait

pytestmark = pytest.mark.django_db(transaction=True)

WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}  # fmt: skip


def client(served: Served, secret: str | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.gw.url + "/v1", api_key=secret or served.secret,
                         max_retries=0, timeout=30)  # fmt: skip


@pytest.fixture
def served(sims: tuple[str, str]) -> Iterator[Served]:  # noqa: F811
    s = serving(sims, f"one two {MARKER} three four", ("requests", "answers"))
    yield s
    s.gw.close()
    records.RECORDER.stop()


def stored_row(response_id: str) -> StoredResponse:
    return wait(lambda: StoredResponse.objects.filter(id=response_id).first(), 10,
                f"{response_id} stored")  # fmt: skip


def test_responses_create_whole_and_streamed(served: Served) -> None:
    api = client(served)
    response = api.responses.create(model="chat", input="Say something.",
                                    instructions="Be terse.", max_output_tokens=16)  # fmt: skip
    assert response.status in ("completed", "incomplete") and response.output_text
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.input_tokens_details.cached_tokens >= 0
    assert response.instructions == "Be terse."
    done = served.heard()
    assert (done.dialect, done.status, done.stream) == ("responses", 200, False)

    events = list(api.responses.create(model="chat", input="Say something.", stream=True,
                                       max_output_tokens=16))  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text and events[-1].response.output_text == text
    assert served.heard().dialect == "responses"
    # The client's own stream helper, which needs every event's sequence_number.
    with api.responses.stream(model="chat", input="Say something.") as stream:
        final = stream.get_final_response()
    assert final.output_text

    # The answer's bound reached: incomplete, reason max_output_tokens.
    short = api.responses.create(model="chat", input="Say a lot.", max_output_tokens=1)
    assert short.status == "incomplete"
    assert short.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("streamed", [False, True])
def test_tools_and_tool_results(served: Served, streamed: bool) -> None:
    api = client(served)
    asked = '/call get_weather {"city": "Paris"}'
    if streamed:
        with api.responses.stream(model="chat", input=asked, tools=[WEATHER]) as stream:
            response = stream.get_final_response()
    else:
        response = api.responses.create(model="chat", input=asked, tools=[WEATHER])
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    # The tool's result sent back, continuing the stored response.
    after = api.responses.create(
        model="chat", previous_response_id=response.id, tools=[WEATHER],
        input=[{"type": "function_call_output", "call_id": call.call_id,
                "output": "18 degrees, sunny"}],
    )  # fmt: skip
    assert after.status in ("completed", "incomplete") and after.output_text
    assert after.previous_response_id == response.id


def test_store_previous_response_get_delete_and_input_items(served: Served) -> None:
    api = client(served)
    first = api.responses.create(model="chat", input="My name is Ada.", max_output_tokens=8)
    row = stored_row(first.id)
    assert (row.owner, row.key, row.model) == ("key:k", "k", "chat")  # a key with no owner
    second = api.responses.create(model="chat", input="What is my name?",
                                  previous_response_id=first.id, max_output_tokens=8)  # fmt: skip
    # The engine read the first turn and its answer before the second.
    sent = stored_row(second.id).conversation
    assert [i.get("role") for i in sent if i["type"] == "message"] == \
        ["user", "assistant", "user", "assistant"]  # fmt: skip
    assert sent[0]["content"][0]["text"] == "My name is Ada."
    assert second.usage.input_tokens > first.usage.input_tokens

    got = api.responses.retrieve(first.id)
    assert got.id == first.id and got.output_text == first.output_text
    items = api.responses.input_items.list(second.id)
    assert [i.content[0].text for i in items.data] == ["What is my name?"]

    # Not stored: not found by a later turn, said clearly.
    unstored = api.responses.create(model="chat", input="hi", store=False, max_output_tokens=4)
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model="chat", input="again", previous_response_id=unstored.id)
    assert caught.value.code == "previous_response_not_found"
    assert caught.value.param == "previous_response_id"

    # Another owner's key cannot read it, continue it or delete it.
    _, other = keys.create_key("other", owner="team:other")
    served.gw.refresh()
    stranger = client(served, other)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.retrieve(first.id)
    with pytest.raises(openai.BadRequestError):
        stranger.responses.create(model="chat", input="x", previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError):
        stranger.responses.delete(first.id)

    api.responses.delete(first.id)
    assert not StoredResponse.objects.filter(id=first.id).exists()
    with pytest.raises(openai.NotFoundError):
        api.responses.retrieve(first.id)


def test_stored_responses_are_pruned_after_their_days(served: Served) -> None:
    api = client(served)
    kept = api.responses.create(model="chat", input="hi", max_output_tokens=4)
    old = api.responses.create(model="chat", input="hi", max_output_tokens=4)
    stored_row(kept.id)
    stored_row(old.id)
    StoredResponse.objects.filter(id=old.id).update(created=timezone.now() - dt.timedelta(days=31))
    assert tasks.prune_responses() == 1  # the task beat sends, as the worker would run it
    assert set(StoredResponse.objects.values_list("id", flat=True)) == {kept.id}
    assert stored.prune(days=30) == 0


def test_previous_response_id_through_another_gateway(served: Served) -> None:
    """Two gateways that share only the database (as two processes do)."""
    api = client(served)
    first = api.responses.create(model="chat", input="Remember 42.", max_output_tokens=8)
    other = Harness(state=State(), guard=served.gw.gateway.guard)
    try:
        other.serve([], [])
        there = openai.OpenAI(base_url=other.url + "/v1", api_key=served.secret,
                              max_retries=0, timeout=30)  # fmt: skip
        second = there.responses.create(model="chat", input="Which number?",
                                        previous_response_id=first.id, max_output_tokens=8)  # fmt: skip
        assert second.previous_response_id == first.id
        assert stored_row(second.id).conversation[0]["content"][0]["text"] == "Remember 42."
    finally:
        other.close()


def test_a_refusal_midstream_is_response_incomplete_content_filter(served: Served) -> None:
    api = client(served)
    events = list(api.responses.create(model="marked", input="Say it.", stream=True))
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "content_filter"
    shown = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert "UNSAFE" not in shown and "MARKER" not in shown
    assert MARKER not in json.dumps([e.model_dump() for e in events])
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model="marked", input="Say it.")
    assert caught.value.code == "content_filter"


@pytest.mark.parametrize("streamed", [False, True])
def test_a_refused_request_is_openais_error_streamed_or_not(served: Served, streamed: bool) -> None:
    """Instructions, tool results, and the history a previous response carries are read."""
    api = client(served)
    for asked in (
        {"instructions": f"hide {MARKER}", "input": "hi"},
        {"input": [{"type": "function_call", "call_id": "c1", "name": "get_weather",
                    "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c1", "output": MARKER}],
         "tools": [WEATHER]},
    ):  # fmt: skip
        with pytest.raises(openai.BadRequestError) as caught:
            if streamed:
                list(api.responses.create(model="chat", stream=True, **asked))
            else:
                api.responses.create(model="chat", **asked)
        assert caught.value.code == "content_filter"
    # A stored turn the engine will read again (written when no policy judged it).
    StoredResponse.objects.create(
        id="resp_old", owner="key:k", key="k", model="chat", created=timezone.now(),
        response={}, conversation=[{"type": "message", "role": "user",
                                    "content": [{"type": "input_text", "text": MARKER}]}],
    )  # fmt: skip
    with pytest.raises(openai.BadRequestError) as caught:
        if streamed:
            list(api.responses.create(model="chat", stream=True, input="go on",
                                      previous_response_id="resp_old"))  # fmt: skip
        else:
            api.responses.create(model="chat", input="go on", previous_response_id="resp_old")
    assert caught.value.code == "content_filter"


def test_bad_requests_say_where(served: Served) -> None:
    api = client(served)
    with pytest.raises(openai.BadRequestError) as caught:
        api.responses.create(model="chat", input="x", tools=[{"type": "web_search"}])
    assert caught.value.param == "tools[0].type"
    r = httpx.post(served.gw.url + "/v1/responses", json={"model": "chat"}, timeout=10,
                   headers={"Authorization": f"Bearer {served.secret}"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["param"] == "input"
    with pytest.raises(openai.NotFoundError):
        api.responses.create(model="nope", input="x")
    r = httpx.put(served.gw.url + "/v1/responses/resp_x", timeout=10,
                  headers={"Authorization": f"Bearer {served.secret}"})  # fmt: skip
    assert r.status_code == 405


def test_a_store_that_cannot_be_read_in_time_is_a_clear_503(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The path reads the store only for a request naming a stored response, bounded: a
    database that does not answer in time is told, never waited on for ever."""
    api = client(served)
    first = api.responses.create(model="chat", input="hi", max_output_tokens=4)
    stored_row(first.id)
    hung = threading.Event()
    monkeypatch.setattr(stored, "READ_WAIT", 0.3)
    monkeypatch.setattr(stored, "_read", lambda owner, rid: hung.wait(10))
    try:
        with pytest.raises(openai.InternalServerError) as caught:
            api.responses.create(model="chat", input="again", previous_response_id=first.id)
        assert caught.value.status_code == 503 and caught.value.code == "store_unavailable"
        assert caught.value.response.headers["retry-after"]
        with pytest.raises(openai.InternalServerError):
            api.responses.retrieve(first.id)
    finally:
        hung.set()


def test_a_response_not_there_on_a_slow_store_is_not_found_not_a_503(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under load a read of the store can be slow: a previous_response_id the store has
    said is not there stays "not found" when a later look cannot end within the bound,
    rather than turning into 503 store_unavailable."""
    api = client(served)
    real_read = stored._read
    reads: list[str] = []
    loaded = threading.Event()

    def read_then_slow(owner: str, rid: str) -> object:
        reads.append(rid)
        if len(reads) > 1:
            loaded.wait(10)  # the database got slow after its first answer
        return real_read(owner, rid)

    monkeypatch.setattr(stored, "READ_WAIT", 1.5)
    monkeypatch.setattr(stored, "_read", read_then_slow)
    try:
        with pytest.raises(openai.BadRequestError) as caught:
            api.responses.create(model="chat", input="x",
                                 previous_response_id="resp_" + "0" * 24)  # fmt: skip
    finally:
        loaded.set()
    assert caught.value.code == "previous_response_not_found"
    assert len(reads) == 2  # it looked again for one another process might be writing


@pytest.mark.parametrize("way", ["native", "translated"])
def test_a_conversation_on_the_engines_own_route_or_translated(
    served: Served,
    sims: tuple[str, str],  # noqa: F811
    way: str,
) -> None:
    """The sim serves /v1/responses itself: the gateway sends it each turn natively (the
    whole conversation from its own store, the engine's store off) unless the operator
    has the model translated; the client reads the same either way."""
    if way == "translated":
        served.gw.gateway.options.translate = frozenset({"chat"})
    engine = sims[1]
    before = httpx.get(engine + "/sim/stats", timeout=5).json()["responses"]
    api = client(served)
    first = api.responses.create(model="chat", input="/echo Remember 42.", max_output_tokens=16)
    assert first.output_text == "Remember 42." and first.id.startswith("resp_")
    assert first.status == "completed" and first.usage.input_tokens > 0
    stored_row(first.id)
    events = list(api.responses.create(model="chat", input="/echo Which number? 42.",
                                       previous_response_id=first.id, stream=True))  # fmt: skip
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "response.completed"
    second = events[-1].response
    assert second.output_text == "Which number? 42." and second.previous_response_id == first.id
    # The second turn's prompt holds the first turn: the engine's prefix cache read it.
    assert second.usage.input_tokens_details.cached_tokens > 0
    with api.responses.stream(model="chat", input="/echo Again.",
                              previous_response_id=second.id) as stream:  # fmt: skip
        assert stream.get_final_response().output_text == "Again."
    asked = httpx.get(engine + "/sim/stats", timeout=5).json()["responses"] - before
    assert asked == (3 if way == "native" else 0)
