"""An engine's error answer reaches the client in OpenAI's shape, its message kept."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.path.errors import ENGINE_MESSAGE_CHARS, from_engine

JSON = b"application/json"


def error_of(status: int, raw: bytes, content_type: bytes | None = JSON) -> dict:
    out = json.loads(from_engine(status, raw, content_type))
    assert list(out) == ["error"] and list(out["error"]) == ["message", "type", "param", "code"]
    return out["error"]


def test_llama_servers_and_vllms_shape_numeric_code_and_no_param() -> None:
    raw = b'{"error":{"code":400,"message":"Only n=1 is supported","type":"invalid_request_error"}}'
    assert error_of(400, raw) == {"message": "Only n=1 is supported",
                                  "type": "invalid_request_error", "param": None, "code": None}  # fmt: skip


def test_openais_own_shape_is_kept() -> None:
    raw = json.dumps({"error": {"message": "too long", "type": "invalid_request_error",
                                "param": "messages", "code": "context_length_exceeded"}}).encode()  # fmt: skip
    assert error_of(400, raw) == {"message": "too long", "type": "invalid_request_error",
                                  "param": "messages", "code": "context_length_exceeded"}  # fmt: skip


def test_vllms_older_top_level_shape() -> None:
    raw = (
        b'{"object":"error","message":"bad lora","type":"BadRequestError","param":null,"code":400}'
    )
    assert error_of(400, raw) == {"message": "bad lora", "type": "BadRequestError",
                                  "param": None, "code": None}  # fmt: skip


def test_fastapis_detail_string_and_validation_list() -> None:
    assert error_of(404, b'{"detail":"Not Found"}')["message"] == "Not Found"
    raw = json.dumps({"detail": [{"loc": ["body", "messages", 0, "content"],
                                  "msg": "Field required", "type": "missing"}]}).encode()  # fmt: skip
    got = error_of(422, raw)
    assert got["message"] == "messages.0.content: Field required"
    assert got["type"] == "invalid_request_error"  # the item's type is not the error's


def test_tgis_string_error() -> None:
    got = error_of(422, b'{"error":"Input validation error","error_type":"validation"}')
    assert (got["message"], got["type"]) == ("Input validation error", "validation")


def test_plain_text_html_and_nothing() -> None:
    assert error_of(400, b"  bad request\n", b"text/plain")["message"] == "bad request"
    html = b"<html><body><h1>413 Request Entity Too Large</h1></body></html>"
    assert error_of(413, html, b"text/html")["message"] == "413 Request Entity Too Large"
    empty = error_of(404, b"", None)
    assert empty["message"] == "The engine answered HTTP 404 with no message."
    assert error_of(501, b"")["type"] == "server_error"


def test_unknown_json_is_passed_as_its_text() -> None:
    assert error_of(400, b'{"oops": 1}')["message"] == '{"oops": 1}'
    assert error_of(400, b'"just words"')["message"] == "just words"


def test_a_long_message_is_bounded() -> None:
    got = error_of(400, json.dumps({"error": {"message": "x" * 100_000}}).encode())
    assert len(got["message"]) == ENGINE_MESSAGE_CHARS
    assert len(error_of(400, b"y" * 10_000_000, b"text/plain")["message"]) == ENGINE_MESSAGE_CHARS


@pytest.mark.parametrize(
    "raw",
    [b'{"error":{"message":"\\ud800 lone"}}', b"\xff\xfe\x00", b"[" * 60_000, b'{"message": NaN}'],
)
def test_odd_bodies_still_give_valid_json(raw: bytes) -> None:
    assert error_of(400, raw)["message"]


def json_values() -> st.SearchStrategy:
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
    return st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                        | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=20)  # fmt: skip


def check(status: int, raw: bytes, content_type: bytes | None) -> None:
    out = from_engine(status, raw, content_type)
    error = json.loads(out.decode("utf-8"))["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert isinstance(error["message"], str) and 0 < len(error["message"]) <= ENGINE_MESSAGE_CHARS
    assert isinstance(error["type"], str) and error["type"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] is None or isinstance(error["code"], str)


statuses = st.integers(min_value=400, max_value=599)
content_types = st.none() | st.sampled_from([JSON, b"text/plain", b"text/html"]) | st.binary()


@given(statuses, st.binary(max_size=4096), content_types)
def test_any_bytes_give_openais_shape(status: int, raw: bytes, content_type: bytes | None) -> None:
    check(status, raw, content_type)


@given(statuses, json_values(), content_types)
def test_any_json_gives_openais_shape(
    status: int, value: object, content_type: bytes | None
) -> None:
    check(status, json.dumps(value).encode(), content_type)


@given(statuses, st.dictionaries(st.sampled_from(["message", "type", "param", "code", "detail",
                                                  "error_type"]), json_values()))  # fmt: skip
def test_any_error_object_gives_openais_shape(status: int, fields: dict) -> None:
    check(status, json.dumps({"error": fields}).encode(), JSON)
    check(status, json.dumps(fields).encode(), JSON)
