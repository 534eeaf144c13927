"""What each card uses (memory used, utilisation), carried by every heartbeat's inventory
as ``cards_use`` (docs/agent-protocol.md): stored on the node through the web process's
lean route and Django's view alike, shown by the node's API detail; a bad one refused with
a 400 naming the field, and nothing of that heartbeat written."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.models import Node
from tests.cluster.helpers import inventory, join_node
from tests.cluster.test_agent_api import agent, beat, lean

H100 = "nvidia-h100-80gb"


def use(*figures: tuple[int, Any, Any]) -> list[dict[str, Any]]:
    return [{"index": i, "memory_used_mb": m, "utilization": u} for i, m, u in figures]


@lean
def test_every_heartbeat_stores_what_each_card_uses_and_the_api_shows_it(
    make_user: Any, client_for: Any
) -> None:
    node, token = join_node("gpu-1", [H100, H100])
    assert node.card_use == {}  # an agent that said nothing
    inv = inventory([H100, H100], hostname="gpu-1", cards_use=use((0, 70_000, 87), (1, 0, 0)))
    assert beat(token, inv).status_code == 200
    assert Node.objects.get().card_use == {
        "0": {"memory_used_mb": 70_000, "utilization": 87},
        "1": {"memory_used_mb": 0, "utilization": 0},
    }
    # The next heartbeat's figures replace them (the same inventory otherwise: the lean
    # route's one statement writes them).
    inv["cards_use"] = use((0, 71_000, 12), (1, None, None))
    assert beat(token, inv).status_code == 200
    assert Node.objects.get().card_use == {
        "0": {"memory_used_mb": 71_000, "utilization": 12},
        "1": {"memory_used_mb": None, "utilization": None},
    }
    # An inventory without cards_use (an older agent) keeps what was held.
    del inv["cards_use"]
    assert beat(token, inv).status_code == 200
    assert Node.objects.get().card_use["0"]["utilization"] == 12
    cards = client_for(make_user("vic", "viewer")).get("/api/v1/cluster/nodes/gpu-1/")
    assert cards.status_code == 200, cards.content
    shown = {c["index"]: (c["memory_used_mb"], c["utilization"]) for c in cards.json()["cards"]}
    assert shown == {0: (71_000, 12), 1: (None, None)}


BAD = [
    ("nope", "inventory.cards_use must be a list"),
    (use((5, 10, 10)), "inventory.cards_use[0].index must be the index of one of inventory.cards (0, 1), not 5"),
    ([{"memory_used_mb": 1}], "inventory.cards_use[0].index must be the index of one of inventory.cards (0, 1), not None"),
    (use((0, 1, 1), (0, 2, 2)), "inventory.cards_use[1]: card 0 is listed twice"),
    (use((0, 90_000, 1)), "inventory.cards_use[0].memory_used_mb must be a whole number from 0 to 81000, not 90000"),
    (use((0, -1, 1)), "inventory.cards_use[0].memory_used_mb must be a whole number from 0 to 81000, not -1"),
    (use((1, 1, 140)), "inventory.cards_use[0].utilization must be a percent from 0 to 100, not 140"),
    (use((1, 1, "high")), "inventory.cards_use[0].utilization must be a percent from 0 to 100, not 'high'"),
    ([3], "inventory.cards_use[0] must be an object with a card's index"),
    ([{"index": [0]}], "inventory.cards_use[0].index must be the index of one of inventory.cards (0, 1), not [0]"),
    ([{"index": True}], "inventory.cards_use[0] must be an object with a card's index"),
]  # fmt: skip


@lean
@pytest.mark.parametrize(("bad", "said"), BAD, ids=[s.split(" must")[0] for _, s in BAD])
def test_a_bad_cards_use_is_refused_naming_it_and_changes_nothing(bad: Any, said: str) -> None:
    node, token = join_node("gpu-1", [H100, H100])
    good = inventory([H100, H100], hostname="gpu-1", cards_use=use((0, 5, 5)))
    assert beat(token, good).status_code == 200
    before = Node.objects.get()
    refused = beat(token, dict(good, cards_use=bad, disk_free_mb=1))
    assert refused.status_code == 400, refused.text
    assert said in refused.text
    after = Node.objects.get()
    assert (after.card_use, after.disk_free_mb, after.last_heartbeat) == (
        before.card_use,
        before.disk_free_mb,
        before.last_heartbeat,
    )
    # The same through Django's view (an agent speaking to a web process without the lean
    # route, as the tests' client does).
    answer = agent(token).post(
        "/api/v1/agent/heartbeat", {"inventory": dict(good, cards_use=bad)}, format="json"
    )
    assert answer.status_code == 400 and said in answer.content.decode()
    assert Node.objects.get().card_use == before.card_use
