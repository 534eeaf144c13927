"""Shared API pieces: the error shape every refused change answers with, the parsers.

Framework: imports no app. An app's refusal extends ``llmgw_core.refused.Refused``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser as DRFJSONParser
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from llmgw_core.lean import nul_at
from llmgw_core.refused import Problem, Refused, problems_of


def problems_response(problems: Iterable[Problem], detail: str) -> Response:
    """Return a 400 listing each problem's field path, message and code.

    The same shape for a body that cannot be read (unknown key, wrong type) and for a
    change the rules refuse, so a script handles one shape.
    """
    errors = [
        {"field": p.field, "message": p.message, "code": p.code}
        | ({"model": p.model} if p.model else {})
        for p in problems
    ]
    return Response({"detail": detail, "errors": errors}, status=status.HTTP_400_BAD_REQUEST)


def shown_once(listed: dict[str, Any], field: str, secret: str) -> Response:
    """Return 201 with a secret just made (an API token, a client key) beside its listing,
    the one time it is shown: under ``field``, and never kept by a cache."""
    response = Response({**listed, field: secret}, status=status.HTTP_201_CREATED)
    response["Cache-Control"] = "no-store"
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Answer a refused change (any app's ``Refused``) with 400 and its problems; else as
    DRF does."""
    if isinstance(exc, Refused):
        return problems_response(problems_of(exc), exc.detail)
    response = drf_exception_handler(exc, context)
    if response is not None and response.status_code == 400 and isinstance(exc, APIException):
        # A body DRF itself refused (unreadable JSON, a serializer's field errors): the
        # same shape as any refusal, so the schema's 400 holds and a script reads one shape.
        detail = exc.detail
        if isinstance(detail, dict) and list(detail) == ["detail"]:
            detail = detail["detail"]
        errors = list(_drf_errors(detail, ()))
        summary = (
            errors[0]["message"]
            if len(errors) == 1 and not errors[0]["field"]
            else ("the request cannot be read")
        )
        response.data = {"detail": summary, "errors": errors}
    return response


def _drf_errors(detail: Any, path: tuple[str, ...]) -> Iterable[dict[str, str]]:
    """Yield DRF's error detail (nested dicts and lists of messages) as field paths."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            yield from _drf_errors(value, (*path, str(key)))
    elif isinstance(detail, list):
        for i, value in enumerate(detail):
            # A list of messages is one field's; a list of dicts is a list's items.
            yield from _drf_errors(value, (*path, str(i)) if isinstance(value, dict) else path)
    else:
        field = ".".join(p for p in path if p != "non_field_errors")
        yield {"field": field, "message": str(detail), "code": getattr(detail, "code", "invalid")}


class TextJSONParser(DRFJSONParser):
    """DRF's JSON parser, refusing a too deeply nested body with 400 like any bad JSON.

    DRF's own turns only ValueError into a ParseError; ``"[" * 5000`` raised
    RecursionError and answered 500. For bodies that are read, not stored: the guard
    check's texts may hold anything.
    """

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - nested too deeply") from None


class JSONParser(TextJSONParser):
    """The API's parser: also refuses text holding a NUL character (``\\u0000``), which
    PostgreSQL cannot store, naming where it is."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        data = super().parse(stream, media_type, parser_context)
        where = nul_at(data)
        if where:
            raise ParseError(
                f"{where}: contains a NUL character (\\u0000), which cannot be stored: remove it"
            )
        return data
