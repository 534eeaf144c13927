"""The live console's details in a real Chromium against ``manage.py serve``.

Each page collects what Chromium's console says (``collect``): htmx's own errors (an
out-of-band swap with no target), the Content-Security-Policy's, the page's exceptions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from catalog.choices import Surface
from catalog.services import Actor, delete_model
from cluster.models import Node, Replica
from tests.catalog.samples import store
from tests.cluster.helpers import join_node
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import FAST, H100, ready, set_policy
from tests.e2e.test_gateway import sim_model as gw_model
from tests.e2e.test_live_console import sim_model

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"


def collect(page: Any) -> list[str]:
    """Return a list that fills with the page's console errors and warnings."""
    errors: list[str] = []
    page.on(
        "console",
        lambda m: m.type in ("error", "warning") and errors.append(f"{m.type}: {m.text}"),
    )
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    return errors


def test_cordon_uncordon_and_drain_say_nothing_in_the_console(
    console: Callable[..., Any], operator: Any
) -> None:
    node, _ = join_node("round-1", [L4])
    page = console(operator)
    errors = collect(page)
    card = page.locator(f"#cluster-node-{node.pk}")
    card.get_by_role("button", name="Cordon", exact=True).click()
    card.locator("[data-role=node-state]", has_text="cordoned").wait_for()
    card.get_by_role("button", name="Uncordon", exact=True).click()
    card.get_by_role("button", name="Cordon", exact=True).wait_for()
    assert not Node.objects.get(pk=node.pk).cordoned
    page.on("dialog", lambda d: d.accept())
    card.get_by_role("button", name="Drain", exact=True).click()
    card.locator("[data-role=node-reason]", has_text="drained").wait_for()
    assert errors == [], errors


def test_a_refused_drain_is_dropped_once_a_model_it_named_is_deleted(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any
) -> None:
    agents("round-2", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="round-2", health="ready").first(), 30, "node")
    store(sim_model("lone"))
    page = console(operator)
    errors = collect(page)
    page.on("dialog", lambda d: d.accept())
    card = page.locator(f"#cluster-node-{node.pk}")
    block = page.locator("#cluster-models article", has_text="lone")
    block.locator("tr.replica[data-state=ready]").wait_for(timeout=60_000)

    # Refused: lone has nowhere else to go. "Drain anyway" drains, and the message goes.
    card.get_by_role("button", name="Drain", exact=True).click()
    refused = card.locator("[data-role=drain-refused]")
    refused.wait_for()
    assert "lone" in refused.inner_text()
    refused.locator("button", has_text="Drain anyway").click()
    card.locator("[data-role=node-reason]", has_text="drained").wait_for()
    wait_for(lambda: refused.count() == 0, 10, "the message cleared by the drain done")

    # Refused again; then lone is deleted: the message and its live button go with it.
    card.get_by_role("button", name="Uncordon", exact=True).click()
    wait_for(lambda: Replica.objects.filter(model_name="lone", desired=True, state="ready"), 60,
             "lone ready again")  # fmt: skip
    card.get_by_role("button", name="Drain", exact=True).click()
    refused.wait_for()
    delete_model("lone", Actor(user=None, surface=Surface.CLI, name="test"))
    block.wait_for(state="detached", timeout=60_000)
    wait_for(lambda: refused.count() == 0, 10, "the refusal dropped with its model")
    assert Node.objects.get(pk=node.pk).cordoned is False  # nothing was drained
    assert errors == [], errors


# Records, in the page, every text the chat's status line shows.
STATS_SEEN = """
() => {
  window.__stats = [];
  const stats = document.getElementById('chat-stats');
  new MutationObserver(() => window.__stats.push(stats.textContent))
    .observe(stats, {childList: true, characterData: true, subtree: true});
}
"""


def test_chat_says_a_model_is_waking_and_a_guard_refusal_is_the_guards(
    control_plane: ControlPlane, console: Callable[..., Any], agents: Callable[..., Agent],
    viewer: Any,
) -> None:  # fmt: skip
    agents("wake-chat", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(
        gw_model("sleepy", scaling={"min": 0, "max": 1},
                 profile={"args": ["--load-time", "6"], "env": dict(FAST)}),
        gw_model("judge", role="guard", guard={"format": "qwen3guard"}),
    )  # fmt: skip
    wait_for(ready("judge"), 90, "the judge ready")
    set_policy(control_plane, "--judges", "judge", "--directions", "requests",
               "--fail", "closed", "--controversial", "safe")  # fmt: skip
    page = console(viewer, "/gateway/chat/")
    errors = collect(page)
    page.evaluate(STATS_SEEN)
    page.select_option("#chat-model", "sleepy")
    page.fill("#chat-message", "/echo good morning")
    page.click("#chat-send")
    answer = page.locator(".chatline.assistant .text").last
    wait_for(lambda: answer.count() and answer.inner_text() == "good morning", 90, "the answer")
    seen = page.evaluate("window.__stats")
    waking = [s for s in seen if s.startswith("waking sleepy: replica #")]
    assert waking, seen  # from the held send to the first token, it said what it waited for
    assert any(" loading" in s or " starting" in s for s in waking), seen
    wait_for(lambda: "answered by" in page.inner_text("#chat-stats"), 10, "the stats")

    page.fill("#chat-message", "/echo UNSAFE-MARKER")
    page.click("#chat-send")
    refusal = page.locator(".chatline.refusal").last
    wait_for(lambda: refusal.count() and "judge" in refusal.inner_text(), 30, "the refusal")
    stats = page.inner_text("#chat-stats")
    assert stats == "refused by the guard" and "HTTP 400" not in stats, stats
    # Chromium logs the refusal's 400 as a failed load: the route's answer, not the page's.
    assert [e for e in errors if "status of 400" not in e] == [], errors
