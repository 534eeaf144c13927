"""Reasons that name what is missing, and a model no node could ever run, as operators see
them, in real Chromium: the dashboard's Unplaced list said "no node has
nvidia-l4-24gb cards" where a node had them but not the engine, or none free."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import reconciler
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db(transaction=True)

L4 = "nvidia-l4-24gb"


def on_l4(name: str, engine: str) -> dict[str, Any]:
    return gpu_model(name, profiles=[{"name": "l4", "engine": engine, "gpu_class": L4, "tp": 1}],
                     scaling={"min": 1, "max": 1})  # fmt: skip


def test_the_dashboard_and_model_page_name_what_is_missing(
    signed_in: Any, operator: Any, live_server: Any
) -> None:
    # One L4 card, on a node running SGLang only; a CPU node running vLLM.
    join_node("l4-node", [L4], engines={"sglang": "0.5.0"})
    join_node("cpu-node", engines={"vllm": "0.11.0"})
    store(on_l4("sg", "sglang"))
    reconciler.tick()  # sg takes the card
    store(on_l4("sg-two", "sglang"), on_l4("vl", "vllm"))
    reconciler.tick()
    page = signed_in(operator)
    page.goto(f"{live_server.url}/cluster/")
    unplaced = page.locator("#cluster-unplaced")
    unplaced.locator("li").first.wait_for()
    items = {
        li.locator("strong").inner_text(): li
        for li in unplaced.locator("li").all()
    }  # fmt: skip
    assert set(items) == {"sg-two", "vl"}, list(items)
    # No card free: said so, and it is not "cannot run here" (room comes back).
    reason = items["sg-two"].locator('[data-role="reason"]').inner_text()
    assert reason == f"needs 1 free {L4} on one node; the best node has 0", reason
    assert items["sg-two"].locator('[data-role="unplaceable"]').count() == 0
    # The card is there, the engine is not, on any node with it: never, naming the engine.
    reason = items["vl"].locator('[data-role="reason"]').inner_text()
    assert reason == (
        f"no node in this cluster can run it: no node with {L4} cards has engine vllm"
    ), reason
    assert items["vl"].locator('[data-role="unplaceable"]').inner_text() == "cannot run here"
    assert f"no node has {L4} cards" not in unplaced.inner_text()
    # The model's card on the dashboard and its own page say it too.
    card = page.locator("article.model", has=page.locator("h3", has_text="vl"))
    assert card.locator('header [data-role="unplaceable"]').count() >= 1
    page.goto(f"{live_server.url}/catalog/models/vl/")
    badge = page.locator('.live-replicas header [data-role="unplaceable"]')
    badge.wait_for()
    assert "has engine vllm" in (badge.get_attribute("title") or "")
    assert "has engine vllm" in page.locator(".live-replicas [data-role=reason]").inner_text()
