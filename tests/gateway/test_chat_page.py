"""The Chat page offers what a client may name, each with what a message to it meets."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cluster.models import Assignment, Replica
from tests.catalog.samples import store
from tests.cluster.helpers import join_node

SIM = [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}]


def model(name: str, lo: int, hi: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "source": f"sim/{name}", "profiles": SIM,
            "scaling": {"min": lo, "max": hi}, **extra}  # fmt: skip


@pytest.mark.django_db
def test_the_chat_offers_models_and_adapters_saying_what_a_message_meets(
    client_for: Any, viewer: Any
) -> None:
    store(model("ready", 1, 1, adapters=[{"name": "ready-sql", "source": "/lora/sql"}]),
          model("roomless", 1, 1), model("lazy", 0, 1), model("off", 0, 0), model("never", 1, 1),
          model("judge", 1, 1, role="guard", guard={"format": "qwen3guard"}))  # fmt: skip
    store(model("asleep-roomless", 0, 1, profiles=[dict(SIM[0], gpu_class="nvidia-b200-180gb")]))
    node, _ = join_node("n1", ["nvidia-h100-80gb"])  # room for one replica of lazy
    r = Replica.objects.create(model_name="ready", state="ready", endpoint="http://n1:9000")
    Assignment.objects.create(replica=r, node=node)
    Replica.objects.create(model_name="roomless", state="pending", unplaced=True,
                           reason="needs 1 free nvidia-h100-80gb on one node; the best node has 0")  # fmt: skip
    Replica.objects.create(model_name="never", state="pending", unplaced=True,
                           reason="no node in this cluster can run it: no node has "
                           "nvidia-h100-80gb cards")  # fmt: skip
    html = client_for(viewer).get("/gateway/chat/").content.decode()
    offered = dict(re.findall(r'<option value="([^"]*)"[^>]*>([^<]*)</option>', html))
    assert offered == {
        "lazy": "lazy — started when asked",
        # Asleep, and no node has its class: a message would wake it into no room.
        "asleep-roomless": "asleep-roomless — no node in this cluster can run it",
        "off": "off — not running (scaling.max 0)",
        "ready": "ready",
        "roomless": "roomless — no room in the cluster now",
        "never": "never — no node in this cluster can run it",
        "ready-sql": "ready-sql (adapter of ready)",
    }  # never the judge
