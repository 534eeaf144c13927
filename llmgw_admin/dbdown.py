"""The console and the REST API while PostgreSQL is away or hung: 503 with
``Retry-After``, at once, never a request held.

Each wait on the database is bounded (``llmgw_core.env.database_from_url``: the connect
timeout for a connection and for the pool's check of one, a statement bound for a query),
so a request that needs the database gets Django's ``OperationalError`` within about the
connect timeout. This answers it: ``DatabaseDownMiddleware`` for an error a view raises,
``server_error`` (the site's ``handler500``) for one raised anywhere else on the way (a
session saved, a middleware's query). The API gets its JSON (``{"detail": ...}``), the
console a short page that needs nothing of the database to render (no template, no
context processor: the signed-in user is read from the database).

A database error of another kind (a missing table, a constraint) is not this: it stays
the 500 it is. SQLite (the embedded mode) is never away, and its errors are left alone.
"""

from __future__ import annotations

import html
import json
import logging
import sys
import threading
import time
from collections.abc import Callable

import psycopg
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse
from django.views import defaults

log = logging.getLogger("llmgw.database")

RETRY_AFTER = 10
# One line a minute while it lasts, with how many requests it answered.
LOG_EVERY_S = 60.0

MESSAGE = (
    "The database does not answer (PostgreSQL is away, or too slow to answer in time): "
    "nothing was read or changed. Try again in {seconds} s; the operator is told in the log."
)


def is_database_down(error: BaseException | None) -> bool:
    """Whether ``error`` says PostgreSQL cannot be reached or did not answer in time."""

    seen = 0
    while error is not None and seen < 5:
        if isinstance(error, psycopg.OperationalError):
            return True
        if not isinstance(error, (OperationalError, InterfaceError)):
            return False
        error = error.__cause__ or error.__context__
        seen += 1
    return False


def answer(request: HttpRequest, error: BaseException) -> HttpResponse:
    """The 503 for ``request``: JSON for the API, a page for the console."""
    _said(request, error)
    text = MESSAGE.format(seconds=RETRY_AFTER)
    if request.path.startswith("/api/") or "json" in request.headers.get("Accept", ""):
        response = HttpResponse(json.dumps({"detail": text}), status=503,
                                content_type="application/json")  # fmt: skip
    else:
        page = (
            "<!doctype html><html lang=en><meta charset=utf-8>"
            f'<meta http-equiv=refresh content="{RETRY_AFTER}">'
            "<title>llmgw: the database does not answer</title>"
            f"<h1>The database does not answer</h1><p>{html.escape(text)}</p>"
            "<p>This page loads again by itself.</p></html>"
        )
        response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
    response["Retry-After"] = str(RETRY_AFTER)
    response["Cache-Control"] = "no-store"
    return response


class DatabaseDownMiddleware:
    """A view's database error that says PostgreSQL is away or hung: 503 (``answer``)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, error: Exception) -> HttpResponse | None:
        return answer(request, error) if is_database_down(error) else None


def server_error(request: HttpRequest, template_name: str = "500.html") -> HttpResponse:
    """The site's ``handler500``: 503 for the database away, else Django's own 500."""
    error = sys.exc_info()[1]
    if is_database_down(error):
        assert error is not None
        return answer(request, error)
    return defaults.server_error(request, template_name)


_lock = threading.Lock()
_last = 0.0
_since = 0


def _said(request: HttpRequest, error: BaseException) -> None:
    """Logged once a minute at most while it lasts (with how many were answered)."""
    global _last, _since
    now = time.monotonic()
    with _lock:
        _since += 1
        if now - _last < LOG_EVERY_S:
            return
        count, _since, _last = _since, 0, now
    log.warning("the database does not answer: %s %s answered 503 (%d since the last line): "
                "%s", request.method, request.path, count, error)  # fmt: skip
