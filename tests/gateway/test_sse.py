"""Events framed whole however the network splits them, bounded."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.path import sse
from gateway.path.sse import DONE, FrameError, Framer, chunk_text, data_of, encode, encode_json

payloads = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)),
        max_size=40,
    ),
    max_size=20,
)


@given(payloads=payloads, cuts=st.lists(st.integers(0, 2000), max_size=30), crlf=st.booleans())
def test_events_survive_any_split(payloads: list[str], cuts: list[int], crlf: bool) -> None:
    stream = b"".join(encode(p) for p in payloads)
    if crlf:
        stream = stream.replace(b"\n", b"\r\n")
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    framer = Framer()
    events: list[bytes] = []
    for a, b in zip(points, points[1:], strict=False):
        events.extend(framer.feed(stream[a:b]))
    assert [data_of(e) for e in events] == [p.encode() for p in payloads]
    assert framer.rest() == b""


def test_a_split_multibyte_character_is_kept_whole() -> None:
    raw = encode("é😀")
    framer = Framer()
    events = [e for i in range(len(raw)) for e in framer.feed(raw[i : i + 1])]
    assert data_of(events[0]).decode() == "é😀"


def test_several_data_lines_join_with_newlines() -> None:
    assert data_of(b"event: x\ndata: a\ndata: b") == b"a\nb"
    assert data_of(b": a comment") is None
    assert data_of(encode(DONE).strip()) == DONE


def test_an_event_past_the_bound_is_refused_not_buffered() -> None:
    framer = Framer(max_event=100)
    framer.feed(b"data: " + b"x" * 50)
    with pytest.raises(FrameError):
        framer.feed(b"x" * 100)


def test_an_engine_that_stops_mid_event_leaves_the_rest() -> None:
    framer = Framer()
    assert framer.feed(b'data: {"a"') == []
    assert framer.rest() == b'data: {"a"'


def test_chunk_text_reads_chat_deltas_completions_and_tool_arguments() -> None:
    chat = {"choices": [{"delta": {"content": "Hel"}}, {"delta": {"content": "lo"}}]}
    assert chunk_text(chat) == "Hello"
    assert chunk_text({"choices": [{"text": "abc"}]}) == "abc"
    tool = {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": '{"q"'}}]}}]}
    assert chunk_text(tool) == '{"q"'
    named = {"choices": [{"delta": {"tool_calls": [{"function": {"name": "f", "arguments": ""}}]}}]}
    assert chunk_text(named) == "f"
    assert chunk_text({"choices": [{"delta": {"reasoning_content": "think"}}]}) == "think"
    for junk in (None, [], {"choices": "x"}, {"choices": [1, {"delta": 3}]}):
        assert chunk_text(junk) == ""


def test_encode_json_round_trips() -> None:
    value = {"a": "é", "b": [1, 2]}
    assert json.loads(data_of(encode_json(value).strip())) == value


def test_the_first_token_is_text_a_tool_call_a_finish_or_usage_not_the_role() -> None:
    def chunk(delta: dict | None = None, finish: str | None = None, **extra: object) -> dict:
        return {"choices": [{"index": 0, "delta": delta or {}, "finish_reason": finish}], **extra}

    assert not sse.carries_token(chunk({"role": "assistant", "content": ""}))
    assert not sse.carries_token(chunk({"role": "assistant"}))
    assert not sse.carries_token({"choices": [], "usage": None})
    assert sse.carries_token(chunk({"content": "Hi"}))
    assert sse.carries_token(chunk({"reasoning_content": "hm"}))
    assert sse.carries_token(chunk({"tool_calls": [{"index": 0, "function": {"name": "f"}}]}))
    assert sse.carries_token(chunk(finish="stop"))
    assert sse.carries_token({"choices": [], "usage": {"completion_tokens": 0}})
    assert sse.carries_token({"choices": [{"index": 0, "text": "x", "finish_reason": None}]})
    # Anything that is not an OpenAI chunk (an engine's error event) is the engine's answer.
    assert sse.carries_token({"error": {"message": "out of memory"}})
    assert sse.carries_token([1, 2])
    assert sse.carries_token({"choices": ["odd"]})


def _data_of_by_lines(event: bytes) -> bytes | None:
    """``data_of`` as it read every event, line by line (its one-line case is quicker)."""
    lines = [line for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines:
        return None
    return b"\n".join(line[5:].removeprefix(b" ") for line in lines)


@given(event=st.one_of(
    st.binary(max_size=60),
    st.builds(lambda a, b: a + b, st.sampled_from([b"data: ", b"data:", b"data:  ", b": x\n",
                                                   b"event: e\ndata: ", b"data: a\ndata: "]),
              st.binary(max_size=40)),
))  # fmt: skip
def test_an_events_data_is_read_as_line_by_line(event: bytes) -> None:
    assert data_of(event) == _data_of_by_lines(event)
