"""Shared API pieces: the error shape every refused change answers with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from catalog.problems import Problem


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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """Answer a refused catalog change with 400 and its problems; else as DRF does."""
    from catalog.services import Refused

    if isinstance(exc, Refused):
        return problems_response(exc.problems, "the catalog refuses this change")
    return drf_exception_handler(exc, context)
