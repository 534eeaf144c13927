"""The Chat page's notes say what a message would meet: an asleep, on-demand
model that a wake could not place is not offered as "started when asked" (the send got
"no room"), in a real Chromium at 1280 and 390 px with the console's errors collected."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import reconciler
from tests.catalog.samples import sim_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "nvidia-h100-80gb"
L4 = "nvidia-l4-24gb"


def notes(page: Any) -> dict[str, str]:
    return dict(
        page.evaluate(
            "[...document.querySelectorAll('#chat-model option')]"
            ".map(o => [o.value, o.textContent.trim()])"
        )
    )


@pytest.mark.parametrize("width", [1280, 390])
def test_an_asleep_model_with_no_room_is_not_offered_as_started_when_asked(
    open_page: Any, viewer: Any, width: int
) -> None:
    join_node("full-1", [H100, L4])
    store(sim_model("busy", 1, tp=None))  # standard: holds the one card
    reconciler.tick()
    # Asleep (min 0, opportunistic): it evicts no one, and no card is free.
    store(
        sim_model("sleepy", 0, tp=None),
        sim_model("spare", 0, tp=None, gpu_class=L4),
    )
    page = open_page(viewer, "/gateway/chat/", {"width": width, "height": 900})
    shown = notes(page)
    assert shown["sleepy"] == "sleepy — no room in the cluster now", shown
    assert shown["spare"] == "spare — started when asked", shown  # its L4 is free
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 1, f"the chat page is {wide} px wider than {width} px"
    assert page.errors == [], page.errors
