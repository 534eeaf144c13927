"""Security headers Django 5.2 does not set itself: the Content-Security-Policy.

The console, the admin and the API docs load scripts, styles and images from this
origin only, and no page runs inline script or inline style: htmx's own indicator style
is off (``templates/base.html``'s ``htmx-config``) and its rules are in ``console.css``;
the API docs page is Swagger UI's split view, its settings script served as a file.
Websockets are to this origin (``connect-src 'self'`` covers ``ws:`` and ``wss:``).
HSTS, behind ``LLMGW_TLS_PROXY``, is Django's ``SecurityMiddleware``'s (settings).
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import sync_and_async_middleware

CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # Swagger UI's and the admin's icons are inline SVG data.
        "img-src 'self' data:",
        "font-src 'self'",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)


@sync_and_async_middleware
def security_headers_middleware(get_response: Any) -> Any:
    """Add the Content-Security-Policy to every answer that does not set its own."""
    if iscoroutinefunction(get_response):

        async def respond_async(request: HttpRequest) -> HttpResponse:
            return _headers(await get_response(request))

        return respond_async

    def respond(request: HttpRequest) -> HttpResponse:
        return _headers(get_response(request))

    return respond


def _headers(response: HttpResponse) -> HttpResponse:
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    return response
