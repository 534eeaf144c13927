"""Collect every app's websocket routes."""

from __future__ import annotations

from typing import Any

from cluster.routing import websocket_urlpatterns as cluster_ws

websocket_urlpatterns: list[Any] = [*cluster_ws]
