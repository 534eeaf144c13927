"""Small helpers for htmx views."""

from __future__ import annotations

from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """An HttpRequest as HtmxMiddleware leaves it, for typing views."""

    htmx: HtmxDetails


def is_partial(request: HttpRequest) -> bool:
    """Return whether to answer with a fragment: htmx asked, not as a boosted page.

    A history-restore request (Back with htmx's cache empty) wants the whole page too.
    """
    htmx = getattr(request, "htmx", None)
    return bool(htmx) and not htmx.boosted and not htmx.history_restore_request  # type: ignore[union-attr]
