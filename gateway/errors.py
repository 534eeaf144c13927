"""Errors as OpenAI's clients read them: ``{"error": {"message", "type", "param", "code"}}``.

Each error is an ``ApiError`` with its HTTP status and the headers the client needs
(``Retry-After`` on 429 and 503, ``x-should-retry: false`` on a refusal). The official
``openai`` client raises its own class for each status: 400 ``BadRequestError``, 401
``AuthenticationError``, 404 ``NotFoundError``, 429 ``RateLimitError``, 503
``InternalServerError``. Messages say what to do; none names a secret.
"""

from __future__ import annotations

import json
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


def rate_limited(what: str, retry_after: float) -> ApiError:
    seconds = max(1, int(retry_after + 0.999))
    return ApiError(
        429,
        f"Rate limit reached for {what}: try again in {seconds} s.",
        type="requests",
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


def content_filter(direction: str, judge: str, categories: list[str]) -> ApiError:
    named = ", ".join(categories) if categories else "unsafe"
    what = "request" if direction == "request" else "answer"
    return ApiError(
        400,
        f"The {what} was refused by the guard: judge '{judge}' found it unsafe ({named}).",
        param="messages" if direction == "request" else None,
        code="content_filter",
        headers={"x-should-retry": "false"},
    )


def upstream_failed(model: str, detail: str) -> ApiError:
    return ApiError(
        502,
        f"No replica of '{model}' gave an answer ({detail}); the request was tried on "
        "every replica and fallback that could take it.",
        type="server_error",
        code="upstream_error",
    )
