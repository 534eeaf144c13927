"""The websocket routes: the console's live view."""

from __future__ import annotations

from typing import Any

from django.urls import re_path

from llmgw_admin import consumer

websocket_urlpatterns: list[Any] = [
    # Topics are validated by the consumer (llmgw_core.events.TOPICS).
    re_path(r"^ws/live/(?P<topics>[a-z,]{1,40})/$", consumer.LiveConsumer.as_asgi()),
]
