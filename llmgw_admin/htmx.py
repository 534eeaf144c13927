"""Small helpers for htmx views."""

from __future__ import annotations

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """An HttpRequest as HtmxMiddleware leaves it, for typing views."""

    htmx: HtmxDetails


def is_partial(request: HttpRequest) -> bool:
    """Return whether to answer with a fragment: htmx asked, and not as a boosted page."""
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted  # type: ignore[union-attr]
