"""The gateway's dialects on its one path: a Responses or Messages request served as the
chat completion it means.

``for_path`` gives a request's dialect by its path (None: chat, completions, embeddings,
which need none). The dialect is made per request and kept on the cycle
(``Cycle.dialect``), where each step of chat's path asks it what differs:

- ``chat_body``: the client's body read by the dialect's translator
  (``gateway.path.dialects``) and turned into a chat body; the gateway then reads that as
  it reads any chat body (``gateway.path.body``), so the key's scope, admission, budgets, the
  guard on the request's text, routing, retries before the first byte, outlier ejection
  and the usage count are chat's;
- ``error_body``: every error the request meets in the dialect's shape (Anthropic's for
  Messages, OpenAI's for Responses);
- ``whole``: the engine's whole chat answer (judged as chat's is) as the dialect's object;
- a streamed answer's chat events, released by the guard's windows, as the dialect's
  typed events (``events``), and its ending: ``finish`` at the engine's ``[DONE]``,
  ``refuse`` when the guard refused the answer (``stop_reason: "refusal"``,
  ``response.incomplete`` with reason ``content_filter``), ``fail`` when the engine's
  stream broke after the first byte.

Where the engine serves the dialect itself and its route is fit
(``gateway.path.dialects.engines``), ``engine_request`` gives the engine's own path and
body for an attempt, and ``native`` reads its answer (``gateway.path.dialects.native``):
its events into the chat chunks they mean (``native_events``), which take the same
guard's windows and the same writer of the dialect's events, its whole answer into the
chat answer it means (``native_whole``). Else ``native`` is None and the request is
translated.

Plain over the translators: no I/O here but what its callers do.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from typing import Any

from gateway.path import errors
from gateway.path.dialects import engines, messages, native, responses
from gateway.path.dialects.common import DialectError, Usage, dump, typed_sse
from gateway.path.dialects.messages_stream import MessagesStream
from gateway.path.dialects.responses_stream import ResponsesStream
from gateway.path.errors import ApiError

CHAT = "chat"
MESSAGES = "messages"
COUNT_TOKENS = "count_tokens"
RESPONSES = "responses"

MESSAGES_PATH = messages.PATH
COUNT_PATH = messages.COUNT_PATH
RESPONSES_PATH = responses.PATH


class Dialect(ABC):
    """One request's dialect (the module's docstring): each says how its body becomes
    chat's and how chat's whole answer comes back; one that streams says how its stream does."""

    name = CHAT
    # The field a client names the answer's bound with (an error about it names it).
    max_tokens_param = "max_tokens"

    def __init__(self, request_id: str = "") -> None:
        self.request_id = request_id
        self.translator: Any = None  # the stream's, once a stream begins
        # The reader of the engine's own answer, for an attempt sent natively (None:
        # translated to chat completions).
        self.native: Any = None
        self.data: dict[str, Any] = {}  # the client's body, as it was read

    def engine_request(self, engine: str, served: str, model: str = "",
                       translate: frozenset[str] = frozenset()) -> tuple[str, bytes] | None:  # fmt: skip
        """The engine's own path and body for an attempt on ``engine`` (the name it knows
        the model by: ``served``), when the dialect goes there natively; None: the chat
        body, translated. Called for every attempt (each may meet another engine)."""
        self.native = None
        return None

    def native_events(self, payload: bytes) -> list[bytes]:
        """A native stream event's data as the chat chunks it means (their data), for
        the guard's windows; ``native.NativeError`` when the engine says it failed."""
        try:
            event = json.loads(payload)
        except (ValueError, RecursionError):
            raise native.NativeError("the engine sent an event that is not JSON") from None
        return [dump(chunk).encode() for chunk in self.native.feed(event)]

    def native_whole(self, raw: bytes) -> bytes:
        """A native whole answer as the chat answer it means (502 when it is not the
        dialect's answer, or says it failed)."""
        try:
            chat = self.native.whole(json.loads(raw))
        except (ValueError, RecursionError, native.NativeError):
            raise errors.not_a_chat_answer() from None
        return dump(chat).encode()

    def error_body(self, error: ApiError) -> bytes:
        return error.body()

    def engine_error(self, status: int, raw: bytes) -> bytes:
        """An engine's error (already in OpenAI's shape: ``errors.from_engine``)."""
        return raw

    @abstractmethod
    def chat_body(self, data: dict[str, Any]) -> dict[str, Any]:
        """The chat completions body this dialect's ``data`` asks for."""

    @abstractmethod
    def whole(self, raw: bytes) -> bytes:
        """Chat's whole answer ``raw`` in this dialect."""

    def stream(self) -> Any:
        """This dialect's stream translator; a dialect that answers whole only (rerank)
        refuses a streamed request with the reason."""
        raise errors.bad_request(f"{self.name} answers are not streamed: send stream false",
                                 "stream")  # fmt: skip

    # A stream: the translator is made at its first event.
    def _translator(self) -> Any:
        if self.translator is None:
            self.translator = self.stream()
        return self.translator

    def events(self, chat_events: list[bytes]) -> bytes:
        """Chat events (``data: <json>`` each, as the guard released them) as the
        dialect's typed events."""
        translator = self._translator()
        out: list[dict[str, Any]] = []
        for event in chat_events:
            payload = event.strip()
            if payload.startswith(b"data:"):
                payload = payload[5:].strip()
            try:
                chunk = json.loads(payload)
            except (ValueError, RecursionError):
                # Judged and released as text: it reaches the client as the dialect's
                # text, never as a raw line its parser would choke on.
                chunk = _text_chunk(payload.decode("utf-8", "replace"))
            out.extend(translator.feed(chunk))
        return typed_sse(out)

    def finish(self, usage: Usage | None) -> bytes:
        return typed_sse(self._translator().finish(usage))

    def refuse(self, usage: Usage | None) -> bytes:
        return typed_sse(self._translator().refuse(usage))

    def fail(self, message: str) -> bytes:
        return typed_sse(self._translator().fail(message))


def _text_chunk(text: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


def read_request(reader: Any, data: Any) -> Any:
    try:
        return reader(data)
    except DialectError as error:
        raise errors.bad_request(error.message, error.param) from None


def _answer(make: Any, raw: bytes) -> bytes:
    """A whole chat answer as the dialect's object; one that is not a chat answer is the
    engine's failure (502), never passed on as if it were."""
    try:
        value = make(json.loads(raw))
    except (ValueError, RecursionError, DialectError):
        raise errors.not_a_chat_answer() from None
    return json.dumps(value, ensure_ascii=False).encode()


class Messages(Dialect):
    """Anthropic's Messages API (``POST /v1/messages``)."""

    name = MESSAGES

    def __init__(self, request_id: str = "") -> None:
        super().__init__(request_id)
        self.request: messages.MessagesRequest | None = None

    def error_body(self, error: ApiError) -> bytes:
        message = error.message
        if error.code == "invalid_api_key":
            # Anthropic's clients send the key in x-api-key (or as a bearer token).
            message = message.replace("as 'Authorization: Bearer <key>'",
                                      "in 'x-api-key' or 'Authorization: Bearer <key>'")  # fmt: skip
        return messages.error_body(error.status, message, code=error.code,
                                   request_id=self.request_id or None)  # fmt: skip

    def engine_error(self, status: int, raw: bytes) -> bytes:
        return messages.from_openai_error(status, raw, self.request_id or None)

    def chat_body(self, data: dict[str, Any]) -> dict[str, Any]:
        self.data = data
        self.request = read_request(messages.read, data)
        return messages.chat_request(self.request)

    def engine_request(self, engine: str, served: str, model: str = "",
                       translate: frozenset[str] = frozenset()) -> tuple[str, bytes] | None:  # fmt: skip
        self.native = None
        where = engines.route(engines.MESSAGES, engine, native=True, model=model,
                              translate=translate)  # fmt: skip
        if where is None or not where.native or self.request is None:
            return None
        self.native = native.MessagesNative()
        body = native.messages_body(self.data, self.request, served)
        return where.path, json.dumps(body, ensure_ascii=False).encode()

    def whole(self, raw: bytes) -> bytes:
        request = self.request
        assert request is not None
        return _answer(lambda chat: messages.answer(request, chat), raw)

    def stream(self) -> MessagesStream:
        assert self.request is not None
        return MessagesStream(self.request)


class CountTokens(Messages):
    """``POST /v1/messages/count_tokens``: Anthropic's errors; no generation."""

    name = COUNT_TOKENS


class Responses(Dialect):
    """OpenAI's Responses API (``POST /v1/responses``)."""

    name = RESPONSES
    max_tokens_param = "max_output_tokens"

    def __init__(self, request_id: str = "") -> None:
        super().__init__(request_id)
        self.request: responses.ResponsesRequest | None = None
        # The items of the conversation ``previous_response_id`` continues (read from
        # the store before the body is translated).
        self.history: list[dict[str, Any]] = []
        # The response as the client had it (what a stored response keeps).
        self.response: dict[str, Any] | None = None
        # The session the request names, and the one of the response it continues.
        self.named: Any = None
        self.previous_session: str | None = None

    def read(self, data: dict[str, Any]) -> responses.ResponsesRequest:
        """The request checked (before its history is read)."""
        self.data = data
        self.request = read_request(responses.read, data)
        return self.request

    def engine_request(self, engine: str, served: str, model: str = "",
                       translate: frozenset[str] = frozenset()) -> tuple[str, bytes] | None:  # fmt: skip
        self.native = None
        where = engines.route(engines.RESPONSES, engine, native=True, model=model,
                              translate=translate)  # fmt: skip
        if where is None or not where.native or self.request is None:
            return None
        self.native = native.ResponsesNative()
        # The conversation from the gateway's own store, whole: the engine keeps none.
        body = native.responses_body(self.data, self.request, self.history, served)
        return where.path, json.dumps(body, ensure_ascii=False).encode()

    def chat_body(self, data: dict[str, Any]) -> dict[str, Any]:
        if self.request is None:
            self.read(data)
        assert self.request is not None
        return read_request(lambda r: responses.chat_request(r, self.history), self.request)

    def whole(self, raw: bytes) -> bytes:
        request = self.request
        assert request is not None
        out = _answer(lambda chat: responses.answer(request, chat), raw)
        self.response = json.loads(out)
        return out

    def stream(self) -> ResponsesStream:
        assert self.request is not None
        return ResponsesStream(self.request)

    def _ended(self) -> None:
        if self.translator is not None and self.translator.ended:
            self.response = self.translator.response()

    def finish(self, usage: Usage | None) -> bytes:
        out = super().finish(usage)
        self._ended()
        return out

    def refuse(self, usage: Usage | None) -> bytes:
        out = super().refuse(usage)
        self._ended()
        return out


ROUTES: dict[str, type[Dialect]] = {
    MESSAGES_PATH: Messages,
    COUNT_PATH: CountTokens,
    RESPONSES_PATH: Responses,
}


def for_path(path: str, request_id: str = "") -> Dialect | None:
    """The dialect of a request to ``path`` (None: chat's own routes, and every other)."""
    made = ROUTES.get(path)
    if made is None and path.startswith(RESPONSES_PATH + "/"):
        made = Responses
    return made(request_id) if made is not None else None


def usage_counted(tokens_in: int, tokens_out: int, cached: int = 0) -> Usage | None:
    """The usage the gateway counted (for an ending the engine's own count did not reach)."""
    if not tokens_in and not tokens_out:
        return None
    return Usage(input=tokens_in, output=tokens_out, cached=min(cached, tokens_in),
                 cached_reported=cached > 0)  # fmt: skip
