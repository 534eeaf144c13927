"""Errors as OpenAI's clients read them: ``{"error": {"message", "type", "param", "code"}}``.

Each error is an ``ApiError`` with its HTTP status and the headers the client needs
(``Retry-After`` on 429 and 503, ``x-should-retry: false`` on a refusal). The official
``openai`` client raises its own class for each status: 400 ``BadRequestError``, 401
``AuthenticationError``, 404 ``NotFoundError``, 429 ``RateLimitError``, 503
``InternalServerError``. Messages say what to do; none names a secret.
"""

from __future__ import annotations

import json
import re
from typing import Any


class ApiError(Exception):
    """An answer the gateway gives instead of the engine's."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def payload(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def body(self) -> bytes:
        return json.dumps(self.payload(), ensure_ascii=False).encode()


def bad_key() -> ApiError:
    return ApiError(
        401,
        "Invalid or expired API key: send a client key as 'Authorization: Bearer <key>' "
        "(an operator makes one with 'manage.py gateway key create NAME').",
        code="invalid_api_key",
    )


def model_not_found(model: str) -> ApiError:
    return ApiError(
        404,
        f"The model '{model}' does not exist or this key may not use it: "
        "GET /v1/models lists the models this key may name.",
        param="model",
        code="model_not_found",
    )


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def context_length_exceeded(model: str, limit: int, asked: int, why: str = "") -> ApiError:
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens; this request asks for at "
        f"least {asked} (prompt plus max_tokens){why}. Shorten the messages or lower "
        "max_tokens.",
        param="messages",
        code="context_length_exceeded",
    )


def rate_limited(what: str, retry_after: float, kind: str = "requests") -> ApiError:
    seconds = max(1, int(retry_after + 0.999))
    return ApiError(
        429,
        f"Rate limit reached for {what}: try again in {seconds} s.",
        type=kind,
        code="rate_limit_exceeded",
        headers={"retry-after": str(seconds)},
    )


def unavailable(message: str, retry_after: float = 5, code: str = "model_unavailable") -> ApiError:
    seconds = max(1, int(retry_after + 0.999))
    return ApiError(
        503,
        message,
        type="server_error",
        code=code,
        headers={"retry-after": str(seconds)},
    )


def unplaceable(model: str, why: str) -> ApiError:
    """A model no node of the cluster could run even empty: waiting will not help, so
    no ``Retry-After`` and ``x-should-retry: false`` (the ``openai`` client would
    otherwise retry a 503 twice)."""
    return ApiError(
        503,
        f"No node in this cluster can run '{model}': {why}. Retrying will not help until "
        "an operator changes the cluster or the model; use another model.",
        type="server_error",
        code="model_unplaceable",
        headers={"x-should-retry": "false"},
    )


def switched_off(model: str, why: str) -> ApiError:
    """A model an operator switched off: nothing will start it, so the answer comes at once,
    with no ``Retry-After`` and ``x-should-retry: false`` (the ``openai`` client would
    otherwise retry a 503 twice)."""
    return ApiError(
        503,
        f"The model '{model}' is {why}: no replica runs and none will start until an "
        "operator scales it up again. Retrying will not help; use another model.",
        type="server_error",
        code="model_switched_off",
        headers={"x-should-retry": "false"},
    )


def peer_down(model: str, peer: str, why: str) -> ApiError:
    """A model of a federated cluster whose breaker is open (docs/federation.md): refused
    at once, never held, with no ``Retry-After`` and ``x-should-retry: false``."""
    reason = f" ({_clean(why)})" if why else ""
    return ApiError(
        503,
        f"The model '{model}' is offered by the federated cluster '{peer}', which is down"
        f"{reason}: nothing is sent to it until it passes its probes again. Retrying now "
        "will not help; use another model.",
        type="server_error",
        code="peer_down",
        headers={"x-should-retry": "false"},
    )


def content_filter(direction: str, judge: str, categories: list[str]) -> ApiError:
    named = ", ".join(categories) if categories else "unsafe"
    what = "request" if direction == "request" else "answer"
    return _guard_refused(
        f"The {what} was refused by the guard: judge '{judge}' found it unsafe ({named}).",
        "messages" if direction == "request" else None,
    )


def _guard_refused(message: str, param: str | None = None) -> ApiError:
    """The guard's refusal (or a text it cannot judge): retrying will not help."""
    return ApiError(
        400, message, param=param, code="content_filter", headers={"x-should-retry": "false"}
    )


def upstream_failed(model: str, detail: str) -> ApiError:
    return ApiError(
        502,
        f"No replica of '{model}' gave an answer ({detail}); the request was tried on "
        "every replica and fallback that could take it.",
        type="server_error",
        code="upstream_error",
    )


def not_found(path: str | None = None) -> ApiError:
    """A path the gateway does not serve (``None``: a gateway with nothing behind it)."""
    if path is None:
        return ApiError(404, "not found", code="not_found")
    return ApiError(
        404,
        f"Unknown path {path}: the gateway serves /v1/models, /v1/chat/completions, "
        "/v1/completions, /v1/embeddings, /v1/responses, /v1/messages, the rerank API, "
        "/v1/files and /v1/batches.",
        code="not_found",
    )


def method_not_allowed(path: str, method: str) -> ApiError:
    """``path`` answers ``method`` only (named in ``Allow``)."""
    return ApiError(
        405, f"{path} takes {method}", code="method_not_allowed", headers={"allow": method}
    )


def body_too_large(limit: int, declared: int | None = None) -> ApiError:
    """A body over the gateway's limit: told at once when its Content-Length says so."""
    if declared is not None:
        message = (
            f"The body is {declared} bytes (its Content-Length), over the gateway's limit "
            f"of {limit} bytes: send less."
        )
    else:
        message = f"The body is over {limit} bytes."
    return ApiError(413, message, code="request_too_large")


def invalid_host(host: bytes | None) -> ApiError:
    """A ``Host`` not in ``LLMGW_ALLOWED_HOSTS`` (``gateway.path.hosts``)."""
    said = repr(host.decode("latin-1")[:200]) if host else "nothing"
    return ApiError(
        400,
        f"The Host header names {said}, which this server does not answer to: reach it by "
        "one of its names, or add this one to LLMGW_ALLOWED_HOSTS.",
        code="invalid_host",
    )


def internal(request_id: str) -> ApiError:
    """The gateway itself failed (a defect): the log says why under ``request_id``."""
    return ApiError(
        500,
        f"The gateway failed this request ({request_id}); its log says why under that id.",
        type="server_error",
        code="internal_error",
    )


def pinned_away(model: str, replica: int, retry_after: float) -> ApiError:
    """A key pinned to one replica (the capacity bench's) whose replica is not in routing."""
    return unavailable(
        f"Replica #{replica} of '{model}' is not in routing (not ready, stopped, or on a "
        "draining node): this key is pinned to it and is never sent to another replica.",
        retry_after,
        code="replica_unavailable",
    )


def pinned_failed(model: str, replica: int, detail: str) -> ApiError:
    """A key pinned to one replica whose replica gave no answer."""
    return ApiError(
        502,
        f"Replica #{replica} of '{model}' gave no answer ({detail}); this key is pinned to "
        "it and is never sent to another replica.",
        type="server_error",
        code="upstream_error",
    )


def starting() -> ApiError:
    """The process has not read its table yet."""
    return unavailable("the gateway is starting: try again")


def not_ready(model: str, retry_after: float) -> ApiError:
    """No ready replica within the model's wait: it is being started."""
    return unavailable(
        f"The model '{model}' has no ready replica yet (it is being started, or the "
        "cluster has no room for it): try again shortly.",
        retry_after,
    )


def no_room(model: str, retry_after: float) -> ApiError:
    """Placement found no room for the model now (it frees slowly)."""
    return unavailable(
        f"The model '{model}' has no ready replica and the cluster has no room to start one "
        "now: try again later, or another model.",
        retry_after,
    )


def not_a_rerank_answer() -> ApiError:
    """An engine's answer to a rerank request that holds no readable ranking."""
    return ApiError(502, "The engine's answer is not a rerank answer.", type="server_error",
                    code="upstream_error")  # fmt: skip


def no_rerank(model: str) -> ApiError:
    return bad_request(
        f"The model '{model}' does not rank documents (its capabilities list neither rerank "
        "nor embeddings): name a reranker model.",
        "model",
        "model_not_supported",
    )


def no_embeddings(model: str) -> ApiError:
    return bad_request(
        f"The model '{model}' does not serve embeddings (its capabilities do not list "
        "them): name an embedding model.",
        "model",
        "model_not_supported",
    )


def no_tools(model: str, param: str | None) -> ApiError:
    return bad_request(
        f"The model '{model}' does not take tools or functions (its capabilities do not "
        "list them).",
        param,
        "model_not_supported",
    )


def max_tokens_exceeded(name: str, asked: int, limit: int) -> ApiError:
    """``name`` (``max_tokens`` or ``max_completion_tokens``) over the model's max_output."""
    return bad_request(
        f"{name} is {asked}, above this model's max_output of {limit}: ask for at most {limit}.",
        name,
        "max_tokens_exceeded",
    )


def held_back(message: str, retry_after: int) -> ApiError:
    """A lower band held at the door while its model is past its latency SLO
    (``gateway.path.admission``): worth retrying after the window."""
    return ApiError(
        429,
        message,
        type="requests",
        code="held_for_slo",
        headers={"retry-after": str(max(1, retry_after)), "x-should-retry": "true"},
    )


def over_budget(key: str, tokens: int, budget: int, out: int) -> ApiError:
    """A request whose reservation alone is more than its key's whole token budget."""
    said = f", and {out} for its answer" if out else ""
    return bad_request(
        f"This request may use up to {tokens} tokens (its prompt, counted by its "
        f"bytes{said}), more than the budget of {key}, {budget} tokens a minute: send less, "
        "or ask for fewer max_tokens.",
        "max_tokens" if out else "messages",
        "tokens_exceed_budget",
    )


def token_ids_unjudgeable(field: str) -> ApiError:
    """Token ids under a policy that judges requests: the guard reads text."""
    return bad_request(
        f"{field} is token ids, which the guard cannot read, and its policy judges "
        "requests: send it as text.",
        field,
        "content_filter",
    )


def unjudged(direction: str) -> ApiError:
    """Every judge failed and the guard's policy fails closed."""
    return _guard_refused(
        f"The {direction} could not be judged (every judge failed) and the guard's policy "
        "fails closed: it was refused. Try again when the judges answer."
    )


def too_long_to_judge(direction: str, characters: int) -> ApiError:
    """A part of ``characters`` still too long for the judge: nothing unjudged passes."""
    return _guard_refused(
        f"The {direction} could not be judged: {characters} characters of it are still too "
        "long for the judge's context, and nothing unjudged is let through."
    )


def stream_failed(told: str) -> ApiError:
    """An engine's stream failed after its first byte: sent as an event, then [DONE]."""
    return ApiError(
        502, f"the engine's stream failed: {told}", type="server_error", code="upstream_error"
    )


# The console's chat (gateway.session): the signed-in user, not a client key.
def chat_origin() -> ApiError:
    return ApiError(
        403, "the chat answers pages of this console only (Origin differs)", code="forbidden"
    )


def chat_sign_in() -> ApiError:
    return ApiError(401, "sign in to the console to chat", code="invalid_session")


def chat_no_role() -> ApiError:
    return ApiError(403, "chatting needs a role (viewer or more)", code="forbidden")


def chat_csrf() -> ApiError:
    return ApiError(403, "CSRF check failed: reload the chat page and send again", code="forbidden")


def chat_sessions_away() -> ApiError:
    """The console's sign-in lives in the database, which does not answer."""
    return unavailable(
        "the console cannot check your sign-in now (its database does not answer): try "
        "again shortly",
        10,
        code="unavailable",
    )


# How much of an engine's error message reaches the client, and how much of its body is
# read for it (an error is short: a longer body is not parsed, its start is the message).
ENGINE_MESSAGE_CHARS = 2000
ENGINE_PARSE_BYTES = 64 * 1024


def _clean(text: str) -> str:
    """Text that encodes as UTF-8 (a lone surrogate, which JSON may hold, becomes '?'),
    trimmed and bounded."""
    text = text.encode("utf-8", "replace").decode("utf-8").strip()
    if len(text) > ENGINE_MESSAGE_CHARS:
        text = text[: ENGINE_MESSAGE_CHARS - 1] + "…"
    return text


def _string(value: Any) -> str | None:
    return _clean(value) or None if isinstance(value, str) else None


def _detail(detail: Any) -> str | None:
    """FastAPI's ``detail``: a string, or its validation errors (``loc``, ``msg``)."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        said = []
        for item in detail:
            if isinstance(item, dict) and isinstance(item.get("msg"), str):
                loc = item.get("loc")
                where = (
                    ".".join(str(p) for p in loc if p != "body") if isinstance(loc, list) else ""
                )
                said.append(f"{where}: {item['msg']}" if where else item["msg"])
        return "; ".join(said) or None
    return None


def _engine_fields(data: Any) -> tuple[str | None, str | None, str | None, str | None]:
    """The message, type, param and code of an engine's JSON error, in the shapes engines
    answer: OpenAI's and llama-server's ``{"error": {...}}``, vLLM's older top-level
    ``{"object": "error", "message", ...}``, TGI's ``{"error": str, "error_type"}``,
    FastAPI's ``{"detail": ...}``."""
    if isinstance(data, str):
        return data, None, None, None
    if not isinstance(data, dict):
        return None, None, None, None
    error = data.get("error")
    if isinstance(error, dict):
        data = error
    elif isinstance(error, str):
        return error, _string(data.get("error_type")), None, None
    message = data.get("message")
    if not isinstance(message, str):
        message = _detail(data.get("detail"))
    return message, _string(data.get("type")), _string(data.get("param")), _string(data.get("code"))


def from_engine(status: int, raw: bytes, content_type: bytes | None = None) -> bytes:
    """An engine's error answer (``status`` 4xx or 5xx) in OpenAI's shape, the engine's
    own message kept (bounded): ``{"error": {"message", "type", "param", "code"}}``.

    ``type`` is the engine's when it gave a string, else ``invalid_request_error`` for a
    4xx and ``server_error`` otherwise; ``param`` and ``code`` are the engine's strings
    (a number, as vLLM and llama-server put the status there, is dropped: None). Nothing
    is added that the engine's body did not say but its status. Never raises."""
    message = kind = param = code = None
    if len(raw) <= ENGINE_PARSE_BYTES:
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError):
            data = None
        message, kind, param, code = _engine_fields(data)
    if not message:
        text = raw[:ENGINE_PARSE_BYTES].decode("utf-8", "replace")
        if content_type is not None and b"html" in bytes(content_type).lower():
            # An HTML page (a proxy's, say): its words, not its tags.
            text = " ".join(re.sub(r"<[^<>]*>", " ", text).split())
        message = text
    message = _clean(message)
    if not message:
        message = f"The engine answered HTTP {status} with no message."
    if kind is None:
        kind = "invalid_request_error" if 400 <= status < 500 else "server_error"
    error = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json.dumps(error, ensure_ascii=False).encode()


# The dialects' own (gateway.path.dialect, gateway.speaking, gateway.stored): each API's shape
# is given them by the request's dialect as they are answered.


def not_a_chat_answer() -> ApiError:
    """An engine's 200 that is not a chat completion, for a dialect to translate."""
    return ApiError(502, "The engine's answer is not a chat completion.", type="server_error",
                    code="upstream_error")  # fmt: skip


def count_tokens_unsupported(model: str, why: str) -> ApiError:
    return ApiError(400, f"'{model}' {why}", param="model", code="count_tokens_unsupported")


def count_failed(model: str, detail: str) -> ApiError:
    return ApiError(502, f"No replica of '{model}' could count the tokens ({detail}).",
                    type="server_error", code="upstream_error")  # fmt: skip


def previous_response_not_found(response_id: str, days: int) -> ApiError:
    return ApiError(
        400,
        f"Previous response with id '{response_id}' not found: it was not stored (store: "
        "false), was deleted, belongs to another owner's key, or is older than "
        f"{days} days.",
        param="previous_response_id", code="previous_response_not_found",
    )  # fmt: skip


def response_not_found(response_id: str) -> ApiError:
    return ApiError(404, f"No response with id '{response_id}' is stored for this key's owner.",
                    param="response_id", code="response_not_found")  # fmt: skip


def store_unavailable(why: str) -> ApiError:
    return unavailable(
        f"The stored responses cannot be read now ({why}): try again shortly, or send the "
        "whole conversation as input without previous_response_id.",
        retry_after=2, code="store_unavailable",
    )  # fmt: skip


def file_not_found(file_id: str) -> ApiError:
    return ApiError(
        404, f"No file {file_id} for this key's owner: it was never uploaded, was deleted, "
        "or is older than LLMGW_FILES_KEEP days.", param="file_id", code="file_not_found",
    )  # fmt: skip


def batch_not_found(batch_id: str) -> ApiError:
    return ApiError(404, f"No batch {batch_id} for this key's owner.", param="batch_id",
                    code="batch_not_found")  # fmt: skip


def invalid_file(message: str) -> ApiError:
    """A batch input file whose lines are refused (the message names each bad line)."""
    return ApiError(400, message, param="file", code="invalid_file")


def batch_store_away(where: str, why: str) -> ApiError:
    return unavailable(f"The batch store ({where}) cannot be reached now: {why}. Try again "
                       "shortly.", 5, code="store_unavailable")  # fmt: skip
