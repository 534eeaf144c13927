"""The console's websocket opens from its own origin only: scheme, host and port exact."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from llmgw_core.origins import origin_allowed, parse_origin
from tests.redisserver import url as redis_url

HOSTS = ["127.0.0.1", "localhost", "[::1]"]


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "ok"),
    [
        ("http://127.0.0.1:8200", "127.0.0.1:8200", "http", True),
        ("http://127.0.0.1:8200.evil.example", "127.0.0.1:8200", "http", False),
        ("http://127.0.0.1:8200@evil.example", "127.0.0.1:8200", "http", False),
        ("http://127.0.0.1:8200/", "127.0.0.1:8200", "http", False),
        ("http://127.0.0.1:9999", "127.0.0.1:8200", "http", False),
        ("http://127.0.0.1", "127.0.0.1:8200", "http", False),
        ("https://127.0.0.1:8200", "127.0.0.1:8200", "http", False),
        ("https://localhost", "localhost", "https", True),
        ("https://localhost:443", "localhost", "https", True),
        ("http://LOCALHOST:8200", "localhost:8200", "http", True),
        ("http://[::1]:8200", "[::1]:8200", "http", True),
        # DNS rebinding: the page's own origin, but not a host the console answers to.
        ("http://evil.example:8200", "evil.example:8200", "http", False),
        ("null", "127.0.0.1:8200", "http", False),
        ("", "127.0.0.1:8200", "http", False),
    ],
)
def test_the_origin_must_be_the_requests_own(origin: str, host: str, scheme: str, ok: bool) -> None:
    assert origin_allowed(origin, host, scheme, HOSTS) is ok


def test_a_trusted_origin_is_matched_whole() -> None:
    trusted = ["https://console.example.com"]
    assert origin_allowed("https://console.example.com", "10.0.0.5:8200", "http", HOSTS, trusted)
    for other in ("https://console.example.com:8443", "http://console.example.com",
                  "https://console.example.com.evil.example"):  # fmt: skip
        assert not origin_allowed(other, "10.0.0.5:8200", "http", HOSTS, trusted)


def test_parse_origin_takes_nothing_after_the_port() -> None:
    assert parse_origin("http://a:1") == ("http", "a", 1)
    assert parse_origin("http://a:1.b") is None
    assert parse_origin("http://a:99999") is None


@pytest.fixture
def redis_layer(settings: Any) -> Any:
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [redis_url(0)], "prefix": f"llmgw-test-{uuid.uuid4().hex[:8]}"},
        }
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def _cookie(user: Any) -> tuple[bytes, bytes]:
    c = Client()
    c.force_login(user)
    return (b"cookie", f"sessionid={c.cookies['sessionid'].value}".encode())


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        (b"http://127.0.0.1:8200", True),
        (b"http://127.0.0.1:8200.evil.example", False),
        (b"http://127.0.0.1:6379", False),
    ],
)
async def test_the_live_websocket_opens_from_the_consoles_own_origin_only(
    redis_layer: Any, viewer: Any, origin: bytes, ok: bool
) -> None:
    from llmgw_admin.asgi import application

    cookie = await sync_to_async(_cookie)(viewer)
    headers = [(b"host", b"127.0.0.1:8200"), (b"origin", origin), cookie]
    comm = WebsocketCommunicator(application, "/ws/live/nodes/", headers=headers)
    connected, _ = await comm.connect(timeout=5)
    assert connected is ok
    await comm.disconnect()
