"""Many consoles of one process, through the real ASGI application and a real Redis layer:
a change is rendered once per role whatever the number of consoles, and every console
still gets it, a viewer's without an operator's buttons; consoles opening together read
and render their snapshot once per role, and one opening after a change gets a snapshot
made afresh that shows it. The web process compresses no console's frames (each would
be deflated on its own).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async

from cluster import live as cluster_live
from cluster import services
from llmgw_admin import consumer as consumer_module
from llmgw_admin import hub as hub_module
from llmgw_admin import server
from llmgw_admin.hub import hub
from tests.cluster.helpers import join_node
from tests.llmgw_admin.test_live_ws import _open, redis_layer  # noqa: F401 (autouse)

pytestmark = pytest.mark.django_db(transaction=True)

VIEWERS = 12
OPERATORS = 4


def _counted(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple]:
    """Count the calls of ``module.name`` (the real function still runs)."""
    calls: list[tuple] = []
    real = getattr(module, name)

    def counting(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, counting)
    return calls


async def _open_all(viewer: Any, operator: Any) -> tuple[list[Any], list[Any]]:
    """Open the consoles together, as a restarted web process's pages reconnect."""
    opened = await asyncio.gather(
        *(_open(viewer) for _ in range(VIEWERS)), *(_open(operator) for _ in range(OPERATORS))
    )
    return list(opened[:VIEWERS]), list(opened[VIEWERS:])


@pytest.mark.asyncio
async def test_a_change_is_rendered_once_per_role_and_reaches_every_console(
    viewer: Any, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    node, _ = await sync_to_async(join_node)("gpu-f", ["nvidia-l4-24gb"])
    renders = _counted(monkeypatch, cluster_live, "nodes_changed")
    viewers, operators = await _open_all(viewer, operator)
    for c in viewers + operators:
        assert f'id="cluster-node-{node.pk}"' in await c.receive_from(timeout=10)
    heard = hub().heard["cluster.nodes"]

    await sync_to_async(services.set_cordon)(node, True)

    for c in viewers + operators:
        frame = await c.receive_from(timeout=10)
        assert f'id="cluster-node-{node.pk}"' in frame
        assert 'data-role="node-state">cordoned<' in frame
        assert ("Uncordon" in frame) == (c in operators)
    events = hub().heard["cluster.nodes"] - heard
    assert events >= 1
    # Once per event and role: 2 roles, not 16 consoles.
    assert sorted(can_act for _, can_act in renders) == [False] * events + [True] * events
    for c in viewers + operators:
        await c.disconnect()


@pytest.mark.asyncio
async def test_consoles_opening_together_share_a_snapshot_until_a_change_arrives(
    viewer: Any, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Shared for as long as no change arrives, however slow the machine is at opening them.
    monkeypatch.setattr(hub_module, "SHARE_S", 60.0)
    node, _ = await sync_to_async(join_node)("gpu-g", ["nvidia-l4-24gb"])
    snapshots = _counted(monkeypatch, consumer_module, "snapshot")
    viewers, operators = await _open_all(viewer, operator)
    for c in viewers + operators:
        first = await c.receive_from(timeout=10)
        assert f'id="cluster-node-{node.pk}"' in first and "cordoned" not in first
        assert ("Cordon" in first) == (c in operators)
    # Once per role: a viewer's snapshot carries no operator's buttons.
    assert sorted(can_act for _, can_act, _, _ in snapshots) == [False, True]

    await sync_to_async(services.set_cordon)(node, True)
    for c in viewers:
        assert 'data-role="node-state">cordoned<' in await c.receive_from(timeout=10)
    # A console opened after the change arrived gets a snapshot made afresh, showing it.
    late = await _open(viewer)
    assert 'data-role="node-state">cordoned<' in await late.receive_from(timeout=10)
    assert len(snapshots) == 3
    for c in [*viewers, *operators, late]:
        await c.disconnect()


def test_the_web_process_deflates_no_console_s_frames() -> None:
    # Deflated, each console's copy of a change is compressed in its own context: CPU a
    # console and a change. Sent as they are, every console of a role gets the same bytes.
    assert server.config("127.0.0.1", 8000).ws_per_message_deflate is False
