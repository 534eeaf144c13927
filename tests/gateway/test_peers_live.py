"""The federated peers' panel is live: through the real ASGI application and a real Redis
channel layer, a console subscribed to ``peers`` gets the panel in its snapshot, and a
refresh that finds the peer gone (its port refusing connections) pushes the panel with
the peer tripped and the error it got; an operator's removal pushes it without the peer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from gateway import peers
from gateway.models import Peer
from tests.gateway.harness import KEY
from tests.gateway.peerserver import PeerServer
from tests.llmgw_admin.test_live_ws import _open, redis_layer  # noqa: F401

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def east(tmp_path: Path, settings: Any) -> Iterator[PeerServer]:
    """A peer listing one model, allowed by plain http, its key in the secrets folder."""
    server = PeerServer(["chat"])
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "east").write_text(KEY + "\n")
    settings.LLMGW_SECRETS_DIR = str(folder)
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [server.host]
    settings.LLMGW_FEDERATION_TRIP_ERRORS = 1
    yield server
    server.stop()


def _refresh() -> None:
    peers.refresh(Peer.objects.get(name="east"))


async def test_a_peer_that_stops_answering_is_pushed_tripped_with_its_error(
    east: PeerServer, viewer: Any, operator: Any
) -> None:
    await sync_to_async(peers.add_peer)("east", east.url, "east")
    await sync_to_async(_refresh)()
    comm = await _open(viewer, "/ws/live/peers/")
    first = await comm.receive_from(timeout=5)
    assert 'id="gateway-peers"' in first and 'data-peer="east" data-state="up"' in first
    assert "east/chat" in first and "Remove" not in first  # a viewer is shown no action

    east.stop()  # the peer is down: its port refuses connections
    await sync_to_async(_refresh)()

    pushed = await comm.receive_from(timeout=5)
    assert 'id="gateway-peers"' in pushed
    assert 'data-peer="east" data-state="tripped"' in pushed
    assert "not reached" in pushed and "since" in pushed

    # A refresh that changes nothing shown pushes nothing (read again, still down): the
    # next frame is the removal's.
    await sync_to_async(_refresh)()
    # Removed by an operator: the panel says there is no peer.
    await sync_to_async(peers.remove_peer)("east", user=operator)
    gone = await comm.receive_from(timeout=5)
    assert 'id="gateway-peers"' in gone and "data-peer" not in gone
    assert "No federated peer" in gone
    await comm.disconnect()


async def test_operators_see_a_remove_button_and_the_dashboard_subscribes(
    east: PeerServer, operator: Any
) -> None:
    await sync_to_async(peers.add_peer)("east", east.url, "east")
    comm = await _open(operator, "/ws/live/nodes,models,judges,peers/")
    first = await comm.receive_from(timeout=5)
    assert 'id="guard-judges"' in first and 'id="gateway-peers"' in first
    assert "/gateway/peers/east/remove/" in first and "csrfmiddlewaretoken" not in first
    await comm.disconnect()
