"""What the gateway reads of a request, and how the body reaches the engine."""

from __future__ import annotations

import pytest

from gateway.path.body import CHAT, COMPLETION, EMBEDDING, BodyError, parse, read, rewrite


def chat(**kw):
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}


def test_a_chat_request_is_read() -> None:
    req = read(CHAT, chat(stream=True, max_tokens=20, stream_options={"include_usage": True}))
    assert (req.model, req.stream, req.include_usage, req.max_tokens) == ("m", True, True, 20)
    assert req.text == "hi" and req.prompt_bytes == 2 and req.messages == 1


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert read(CHAT, chat(max_tokens=5, max_completion_tokens=9)).max_tokens == 9


def test_the_affinity_key_is_the_conversations_lead_not_its_last_turn() -> None:
    first = read(
        CHAT,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "q1"},
            ],
        },
    )
    later = read(
        CHAT,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1"},
                {"role": "user", "content": "q2"},
            ],
        },
    )
    other = read(
        CHAT,
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "other"},
            ],
        },
    )
    assert first.affinity == later.affinity != other.affinity
    assert "q2" in later.text


def test_content_parts_are_read_as_text() -> None:
    req = read(
        CHAT,
        {
            "model": "m",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "look"},
                        {"type": "image_url", "image_url": {"url": "x"}},
                    ],
                }
            ],
        },
    )
    assert req.text == "look"


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        (CHAT, [], None),
        (CHAT, {"messages": [{"role": "user", "content": "x"}]}, "model"),
        (CHAT, {"model": "m"}, "messages"),
        (CHAT, {"model": "m", "messages": []}, "messages"),
        (CHAT, {"model": "m", "messages": ["x"]}, "messages[0]"),
        (CHAT, {"model": "m", "messages": [{"content": "x"}]}, "messages[0].role"),
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        (CHAT, chat(stream="yes"), "stream"),
        (CHAT, chat(max_tokens=0), "max_tokens"),
        (CHAT, chat(max_tokens=True), "max_tokens"),
        (CHAT, chat(stream_options=[]), "stream_options"),
        (COMPLETION, {"model": "m", "prompt": 5}, "prompt"),
        (EMBEDDING, {"model": "m", "input": []}, "input"),
    ],
)
def test_a_bad_body_names_where(kind: str, body: object, param: str | None) -> None:
    with pytest.raises(BodyError) as caught:
        read(kind, body)
    assert caught.value.param == param


def test_completions_and_embeddings_are_read() -> None:
    assert read(COMPLETION, {"model": "m", "prompt": ["a", "b"]}).text == "a\nb"
    emb = read(EMBEDDING, {"model": "m", "input": ["x", "y"], "stream": True})
    assert emb.text == "x\ny" and not emb.stream and emb.affinity == ""


def test_the_engine_gets_its_served_name_and_usage_always() -> None:
    body = chat(stream=True, temperature=0.2)
    out = rewrite(body, served="m-served", stream=True)
    assert out["model"] == "m-served" and out["stream_options"] == {"include_usage": True}
    assert out["temperature"] == 0.2 and body["model"] == "m"  # the client's body untouched
    assert rewrite(chat(), served="s", stream=False, adapter="lora-a")["model"] == "lora-a"
    assert "stream_options" not in rewrite(chat(), served="s", stream=False)


# Every text the engine reads is in the judged text: the audit found tool calls, legacy
# function calls and the tool definitions missing, so a judge never read them.
def test_tool_calls_and_tool_definitions_are_in_the_judged_text() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": None,
                "reasoning_content": "thought-A",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "name-B", "arguments": '{"q": "args-C"}'},
                    }
                ],
            },
            {"role": "assistant", "function_call": {"name": "fn-D", "arguments": "args-E"}},
            {"role": "tool", "tool_call_id": "c1", "name": "tool-F", "content": "result-G"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "tool-H",
                    "description": "desc-I",
                    "parameters": {"type": "object", "properties": {"p-J": {"type": "string"}}},
                },
            }
        ],
        "functions": [{"name": "legacy-K", "description": "desc-L"}],
    }
    req = read(CHAT, body)
    for marker in "ABCDEFGHIJKL":
        assert f"-{marker}" in req.text, marker
    # The tools go first, as chat templates put them; the conversation's key is unchanged.
    assert req.text.index("desc-I") < req.text.index("hi")
    assert req.affinity == read(CHAT, chat()).affinity
    assert req.prompt_bytes == len(req.text.encode())


def test_arguments_given_as_an_object_are_judged_as_json() -> None:
    call = {"function": {"name": "f", "arguments": {"q": "inside"}}}
    body = {"model": "m", "messages": [{"role": "assistant", "tool_calls": [call]}]}
    assert '{"q": "inside"}' in read(CHAT, body).text


def test_refusal_and_untyped_text_parts_are_judged() -> None:
    content = [{"type": "refusal", "refusal": "no-A"}, {"text": "untyped-B"}]
    req = read(CHAT, {"model": "m", "messages": [{"role": "assistant", "content": content}]})
    assert "no-A" in req.text and "untyped-B" in req.text


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "assistant", "tool_calls": "x"}, "messages[0].tool_calls"),
        ({"role": "assistant", "tool_calls": ["x"]}, "messages[0].tool_calls[0]"),
        (
            {"role": "assistant", "tool_calls": [{"function": 3}]},
            "messages[0].tool_calls[0].function",
        ),
        ({"role": "assistant", "function_call": "f"}, "messages[0].function_call"),
    ],
)
def test_a_bad_tool_call_names_where(message: dict, param: str) -> None:
    with pytest.raises(BodyError) as caught:
        read(CHAT, {"model": "m", "messages": [message]})
    assert caught.value.param == param


def test_tools_not_a_list_names_where() -> None:
    for field in ("tools", "functions"):
        with pytest.raises(BodyError) as caught:
            read(CHAT, chat(**{field: {"name": "f"}}))
        assert caught.value.param == field


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"function_call": "auto"}, "function_call"),
        ({}, None),
        ({"tools": [], "functions": []}, None),
        ({"tool_choice": "none", "function_call": "none"}, None),
    ],
)
def test_a_request_says_whether_it_asks_for_tools(extra: dict, param: str | None) -> None:
    req = read(CHAT, chat(**extra))
    assert (req.uses_tools, req.tools_param) == (param is not None, param)


@pytest.mark.parametrize(
    ("prompt", "count"), [([1, 2, 3], 3), ([[1, 2], [3]], 3), ([0], 1), ([[7]], 1)]
)
def test_a_prompt_of_token_ids_is_read_and_marked(prompt: list, count: int) -> None:
    req = read(COMPLETION, {"model": "m", "prompt": prompt})
    assert req.token_ids and req.text == "" and req.prompt_bytes == count
    emb = read(EMBEDDING, {"model": "m", "input": prompt})
    assert emb.token_ids and emb.text == "" and emb.prompt_bytes == count


def test_text_prompts_are_not_marked_as_token_ids() -> None:
    assert not read(COMPLETION, {"model": "m", "prompt": "a"}).token_ids
    assert not read(COMPLETION, {"model": "m", "prompt": ["a"]}).token_ids
    assert not read(EMBEDDING, {"model": "m", "input": ["a"]}).token_ids
    assert not read(CHAT, chat()).token_ids


@pytest.mark.parametrize(
    "value", [[1, "a"], [[1], []], [True], [-1], [1.5], [[1], 2], [["a"]], [{"t": 1}], {}]
)
def test_what_is_neither_text_nor_token_ids_is_refused(value: object) -> None:
    for kind, field in ((COMPLETION, "prompt"), (EMBEDDING, "input")):
        with pytest.raises(BodyError) as caught:
            read(kind, {"model": "m", field: value})
        assert caught.value.param == field
        assert "token ids" in caught.value.message


@pytest.mark.parametrize("model", [5, True, [], {}, ""])
def test_a_model_not_a_string_is_told_to_be_one(model: object) -> None:
    with pytest.raises(BodyError) as caught:
        read(CHAT, chat(model=model))
    assert caught.value.param == "model"
    assert "must be a string naming a model" in caught.value.message


def test_a_missing_model_is_required() -> None:
    with pytest.raises(BodyError) as caught:
        read(CHAT, {"messages": [{"role": "user", "content": "x"}]})
    assert caught.value.message.startswith("model is required")


def test_a_json_object_is_parsed() -> None:
    assert parse(b'{"model": "m", "temperature": 0.5}') == {"model": "m", "temperature": 0.5}


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_not_json(constant: str) -> None:
    with pytest.raises(BodyError) as caught:
        parse(f'{{"model": "m", "temperature": {constant}}}'.encode())
    assert constant.lstrip("-") in caught.value.message
    assert "send a finite number" in caught.value.message


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b"\xff\xfe",
        b"[" * 100_000 + b"]" * 100_000,
    ],
)
def test_what_is_not_json_is_refused(raw: bytes) -> None:
    with pytest.raises(BodyError) as caught:
        parse(raw)
    assert caught.value.message.startswith("The body is not JSON")


@pytest.mark.parametrize("raw", [b"[]", b'"x"', b"3", b"null"])
def test_json_that_is_not_an_object_is_refused(raw: bytes) -> None:
    with pytest.raises(BodyError) as caught:
        parse(raw)
    assert "must be a JSON object" in caught.value.message


def test_a_number_that_reads_as_infinity_is_refused() -> None:
    with pytest.raises(BodyError) as caught:
        parse(b'{"model": "m", "temperature": -1e999}')
    assert "send a finite number" in caught.value.message
    assert parse(b'{"t": 1e308, "u": 1e-999}') == {"t": 1e308, "u": 0.0}
