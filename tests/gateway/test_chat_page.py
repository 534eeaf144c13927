"""The Chat page offers what a client may name, each with what a message to it meets."""

from __future__ import annotations

import re
from typing import Any

import pytest

from cluster.models import Assignment, Replica
from tests.catalog.samples import sim_model, store
from tests.cluster.helpers import join_node


@pytest.mark.django_db
def test_the_chat_offers_models_and_adapters_saying_what_a_message_meets(
    client_for: Any, viewer: Any
) -> None:
    store(sim_model("ready", 1, tp=None, adapters=[{"name": "ready-sql", "source": "/lora/sql"}]),
          sim_model("roomless", 1, tp=None), sim_model("lazy", 0, tp=None),
          sim_model("off", 0, most=0, tp=None), sim_model("never", 1, tp=None),
          sim_model("judge", 1, tp=None, role="guard", guard={"format": "qwen3guard"}))  # fmt: skip
    store(sim_model("asleep-roomless", 0, tp=None, gpu_class="nvidia-b200-180gb"))
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
