"""What the gateway reads of a request, and how the body reaches the engine."""

from __future__ import annotations

import pytest

from gateway.body import CHAT, COMPLETION, EMBEDDING, BodyError, read, rewrite


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
