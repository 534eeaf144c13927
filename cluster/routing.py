"""The cluster's websocket routes."""

from __future__ import annotations

from django.urls import re_path

from cluster import consumers

websocket_urlpatterns = [
    # Topics are validated by the consumer (cluster.events.TOPICS).
    re_path(r"^ws/live/(?P<topics>[a-z,]{1,40})/$", consumers.LiveConsumer.as_asgi()),
]
