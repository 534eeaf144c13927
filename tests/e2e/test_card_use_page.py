"""A node's cards' use on its page: a real agent on a simulated node reports
each card's memory used and utilisation with its heartbeats, derived from its replicas'
state and its sim engine's busy slots; the node page, open in Chromium at 1280 and 390 px,
shows them and follows a request held in the engine without a reload, no console error."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

import httpx
import pytest

from cluster.models import Node, Replica
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import engine_auth, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"


def test_a_nodes_page_shows_its_cards_use_and_follows_the_engines_load(
    console: Any, agents: Any, viewer: Any
) -> None:
    agents("use-1", "--simulate", f"2x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="use-1").first(), 60, "the agent to join")
    store(sim_model("busy", gpu_class=L4, profile={"args": ["--ttft", "60", "--parallel", "4"]}))
    ready = wait_for(
        lambda: Replica.objects.filter(model_name="busy", state="ready").first(), 90, "ready"
    )
    # 90% of a 24 GB card held by the ready replica; the other card idle.
    held = round(24 * 1024 * 0.9)

    def figures() -> dict[str, Any] | None:
        use = Node.objects.get(pk=node.pk).card_use
        return use if any(u["memory_used_mb"] == held for u in use.values()) else None

    use = wait_for(figures, 30, "the heartbeat's figures")
    card = next(i for i, u in use.items() if u["memory_used_mb"] == held)
    assert use[card]["utilization"] == 0
    idle = next(i for i in use if i != card)
    assert use[idle] == {"memory_used_mb": 0, "utilization": 0}

    pages = []
    for width in (1280, 390):
        page = console(viewer, f"/cluster/nodes/{node.pk}/")
        page.set_viewport_size({"width": width, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m, e=errors: e.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda x, e=errors: e.append(str(x)))
        row = page.locator(f"#node-cards tr[data-card='{card}']")
        assert row.locator("[data-role=memory-used]").inner_text() == "22 GB"
        assert row.locator("[data-role=utilization]").inner_text() == "0%"
        pages.append((page, row, errors, width))

    # One request held in its slot (a 60 s first token): 1 of 4 slots busy.
    def ask() -> None:
        # Held until the engine answers or goes away with the test's agents.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                ready.endpoint + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                headers=engine_auth(ready.pk), timeout=90,
            )  # fmt: skip

    threading.Thread(target=ask, daemon=True).start()
    for page, row, errors, width in pages:
        row.locator("[data-role=utilization]", has_text="25%").wait_for(timeout=30_000)
        wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 1, f"the node page is {wide} px wider than {width} px"
        assert errors == [], errors
