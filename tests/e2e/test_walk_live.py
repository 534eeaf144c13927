"""The live pages of issues 16 and 17 with their sockets open, against a real control
plane with a real agent and a ready sim replica, in Chromium at 1280 and 390 px as an
admin and as a viewer: nothing in the console (the live server of tests/browser serves no
socket, so its walk leaves the sockets' errors out; here none is left out), nothing past
the window's edge. An admin cordons and uncordons the node on the open dashboard: the
pushed swaps find their targets (htmx would say oobErrorNoTarget)."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.models import Node, Replica
from tests.browser.test_walk_pages import OVERFLOW
from tests.catalog.samples import store
from tests.e2e.conftest import wait_for
from tests.e2e.test_live_console import sim_model

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"
LIVE = ["/cluster/", "/catalog/", "/catalog/models/walked/", "/guard/", "/gateway/traffic/"]


@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_the_live_pages_say_nothing_in_the_console_at_both_widths(
    console: Any, agents: Any, make_user: Any, role: str
) -> None:
    agents("walk-1", "--simulate", f"2x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="walk-1").first(), 60, "the agent")
    store(sim_model("walked"))
    ready = Replica.objects.filter(model_name="walked", state="ready")
    wait_for(ready.exists, 90, "the replica ready")
    user = make_user(f"walk-{role}", role)
    found: dict[str, Any] = {}
    for width in (1280, 390):
        for path in LIVE:
            page = console(user, path)
            page.set_viewport_size({"width": width, "height": 900})
            errors: list[str] = []
            page.on("console", lambda m, e=errors: e.append(m.text) if m.type in ("error", "warning") else None)  # fmt: skip
            page.on("pageerror", lambda x, e=errors: e.append(str(x)))
            # Again with the listeners on, so the socket's snapshot is heard too.
            page.reload()
            page.wait_for_selector("[data-live-status].on")
            if path == "/cluster/" and role == "admin":
                card = page.locator(f"#cluster-node-{node.pk}")
                card.get_by_role("button", name="Cordon", exact=True).click()
                card.locator("[data-role=node-state]", has_text="cordoned").wait_for()
                card.get_by_role("button", name="Uncordon", exact=True).click()
                card.locator("[data-role=node-state]", has_text="ready").wait_for()
            wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            cut = page.evaluate(OVERFLOW)
            if errors or wide > 1 or cut:
                found[f"{width} {path}"] = {"errors": errors, "wider by": wide, "cut": cut}
            page.close()
    assert found == {}, found
