"""The Updates page hears each step live, through the real ASGI application and a real
Redis layer: an update's look marks its model, the consumer tells the page (with its
filters) to ask for its table."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from tests.updates.test_flow_run import chat  # noqa: F401 - the fixture
from tests.updates.test_live_badge import redis_layer  # noqa: F401 - autouse
from tests.waiting import wait_until
from updates import run
from updates.models import Fetch

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_the_updates_page_is_told_to_ask_for_its_table_as_an_update_moves(
    chat: str,  # noqa: F811
    viewer: Any,
) -> None:
    from django.test import Client

    from llmgw_admin.asgi import application

    def cookie() -> tuple[bytes, bytes]:
        c = Client()
        c.force_login(viewer)
        return (b"cookie", f"sessionid={c.cookies['sessionid'].value}".encode())

    comm = WebsocketCommunicator(
        application,
        "/ws/live/models/?view=updates&state=fetching&q=ch",
        headers=[(b"origin", b"http://localhost"), await sync_to_async(cookie)()],
    )
    connected, _ = await comm.connect(timeout=5)
    assert connected
    assert await comm.receive_from(timeout=10) == ""  # the page's own render is the snapshot

    def start_and_fetch() -> None:
        r = run.start("chat")
        # The fetch runs on its own thread (the embedded mode's dispatch): waited for,
        # never run a second time beside it.
        wait_until(lambda: Fetch.objects.filter(pk=r.fetch_id, state="done").exists(), 60,
                   "the update's fetch to end")  # fmt: skip
        run.advance(r.pk)

    await sync_to_async(start_and_fetch)()
    frame = ""
    for _ in range(5):
        frame = await comm.receive_from(timeout=10)
        if 'id="updates-region-poke"' in frame:
            break
    assert 'hx-get="/updates/?region=1&amp;q=ch&amp;state=fetching"' in frame, frame
    assert 'hx-target="#updates-region"' in frame and "cluster-models" not in frame
    await comm.disconnect()
