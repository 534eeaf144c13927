"""The Chat page's note of a model after a send: the page opened while the
cluster had room for an asleep model ("started when asked"); the cluster filled, the send
woke the model into no room, and its note now says so. A real control plane, a real
agent with a sim engine, the page in Chromium; the gateway's wake wait set short."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import codec, services
from catalog.choices import Surface
from cluster.models import Node, Replica
from tests.catalog.samples import store
from tests.e2e.conftest import ControlPlane, wait_for
from tests.e2e.test_gateway import FAST, sim_model

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path) -> Iterator[ControlPlane]:
    """The web process, holding a send for a model woken from zero 8 s at most."""
    cp = ControlPlane(tmp_path, extra={"LLMGW_GATEWAY_WAKE_WAIT": "8"})
    cp.start()
    yield cp
    cp.stop()


def note(page: Any, model: str) -> str:
    return page.locator(f"#chat-model option[value='{model}']").inner_text().strip()


def test_a_send_that_met_no_room_says_so_in_its_models_note(
    console: Any, agents: Any, viewer: Any
) -> None:
    agents("notes-1", "--simulate", f"1x {L4}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(name="notes-1", health="ready").exists(), 60, "node")
    profile = {"gpu_class": L4, "env": dict(FAST)}
    asleep = {"min": 0, "max": 1}
    store(sim_model("sleepy", scaling=asleep, profile=profile),
          sim_model("busy", scaling=asleep, profile=profile))  # fmt: skip
    page = console(viewer, "/gateway/chat/")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    assert note(page, "sleepy") == "sleepy — started when asked"  # the card is free

    # The cluster fills: busy, scaled to 1 (standard now), takes the one card, which
    # sleepy (on demand, opportunistic) may not take from it.
    m, problems = codec.decode_model(sim_model("busy", profile=profile))
    assert not problems, problems
    services.save_model(m, services.Actor(user=None, surface=Surface.CLI, name="operator"),
                        replacing="busy")  # fmt: skip
    busy = Replica.objects.filter(model_name="busy", state="ready")
    wait_for(busy.exists, 90, "busy ready")
    # A first message, to busy, answered (the web process's gateway starts on the first).
    for _ in range(30):
        page.select_option("#chat-model", "busy")
        page.fill("#chat-message", "/echo warm")
        page.click("#chat-send")
        line = page.locator(".chatline.assistant, .chatline.refusal").last
        wait_for(lambda line=line: line.count() and line.inner_text(), 30, "an answer")
        if page.locator(".chatline.assistant .text", has_text="warm").count():
            break
        page.locator("#chat-send:not([disabled])").wait_for()
    page.locator("#chat-send:not([disabled])").wait_for()
    page.select_option("#chat-model", "sleepy")
    page.fill("#chat-message", "hello")
    page.click("#chat-send")
    refusal = page.locator(".chatline.refusal").last
    refusal.wait_for(timeout=60_000)
    assert "has no room to start one now" in refusal.inner_text()
    assert Replica.objects.filter(model_name="sleepy", unplaced=True).exists()
    assert note(page, "sleepy") == "sleepy — no room in the cluster now"
    assert note(page, "busy") == "busy — started when asked"  # as the page was opened
    # Chromium logs each 503 as a failed load: the route's answers, not the page's.
    assert [e for e in errors if "status of 503" not in e] == [], errors
