"""The catalog list hears a model's "update available" live, through the real ASGI
application and a real Redis layer: a check marks the model, the consumer pushes its badge."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.test import Client

from tests.catalog.samples import gpu_model, store
from tests.redisserver import url as redis_url
from tests.updates.hubstandin import HubStandIn
from updates import checking, live, mirror

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture(autouse=True)
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


def _prepare(hub: HubStandIn, viewer: Any) -> tuple[bytes, bytes]:
    hub.commit("org/chat", {"model.safetensors": b"1" * 100})
    store(gpu_model("chat"))
    mirror.run_fetch(mirror.request_fetch("chat", start=False).pk)
    hub.commit("org/chat", {"model.safetensors": b"2" * 100})
    c = Client()
    c.force_login(viewer)
    return (b"cookie", f"sessionid={c.cookies['sessionid'].value}".encode())


async def test_the_catalog_list_hears_update_available(hub: HubStandIn, viewer: Any) -> None:
    from llmgw_admin.asgi import application

    cookie = await sync_to_async(_prepare)(hub, viewer)
    comm = WebsocketCommunicator(
        application,
        "/ws/live/models/?view=catalog",
        headers=[(b"origin", b"http://localhost"), cookie],
    )
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await sync_to_async(checking.check_models)(["chat"])
    badge = live.badge_dom_id("chat")
    for _ in range(5):
        frame = await comm.receive_from(timeout=10)
        if badge in frame:
            break
    assert f'id="{badge}"' in frame and "update available" in frame
    await comm.disconnect()


async def test_a_model_page_is_told_to_ask_for_its_panel_when_a_check_ends(
    hub: HubStandIn, viewer: Any
) -> None:
    from llmgw_admin.asgi import application

    cookie = await sync_to_async(_prepare)(hub, viewer)
    comm = WebsocketCommunicator(
        application,
        "/ws/live/models/?model=chat",
        headers=[(b"origin", b"http://localhost"), cookie],
    )
    connected, _ = await comm.connect(timeout=5)
    assert connected
    await comm.receive_from(timeout=10)  # the snapshot
    await sync_to_async(checking.check_models)(["chat"])
    for _ in range(5):
        frame = await comm.receive_from(timeout=10)
        if 'id="updates-panel-poke"' in frame:
            break
    # The page is told to ask for its panel (with its own session: the viewer's panel).
    assert 'hx-get="/updates/models/chat/panel/"' in frame and 'hx-trigger="load"' in frame
    await comm.disconnect()
