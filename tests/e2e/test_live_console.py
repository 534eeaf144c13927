"""The live console in a real Chromium against a real control plane and real agents.

The web process is `manage.py serve` (uvicorn, the embedded in-memory channel layer, the
reconciler in-process); agents are processes with simulated cards running sim engines.
Nothing here reloads a page after it is open: every change must arrive over the socket.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from cluster.models import Node
from tests.catalog import samples
from tests.catalog.samples import store
from tests.e2e.conftest import ROOT, Agent, ControlPlane, wait_for

# 133 s for the seven at load 8 to 14 (the evaluation's 48, the others 12 to 26 each), where
# the run's order counted a minute each.
pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.takes(15)]

L4 = "nvidia-l4-24gb"

# Records, in the page, each state a model's replica rows show as the DOM changes.
SEEN_STATES = """
(model) => {
  window.__states = [];
  const look = () => {
    for (const block of document.querySelectorAll('#cluster-models article')) {
      if (!block.textContent.includes(model)) continue;
      for (const row of block.querySelectorAll('tr.replica')) {
        const s = row.dataset.state;
        if (window.__states[window.__states.length - 1] !== s) window.__states.push(s);
      }
    }
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
}
"""


# The sims here are L4s.
sim_model = partial(samples.sim_model, gpu_class=L4)


def test_nodes_and_replicas_arrive_without_reloading(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any, viewer: Any
) -> None:
    op = console(operator)
    watcher = console(viewer)
    assert "No node has joined yet" in watcher.inner_text("#cluster-nodes")

    agents("live-1", "--simulate", f"2x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="live-1", health="ready").first(), 30, "node")
    # The node appears in both open consoles, cards and all.
    for page in (op, watcher):
        card = page.locator(f"#cluster-node-{node.pk}")
        card.wait_for()
        card.locator("[data-role=class-use]", has_text="2 free of 2").wait_for()

    store(sim_model("chat-live"))
    for page in (op, watcher):
        page.locator("#cluster-models article", has_text="chat-live").wait_for()
    block = watcher.locator("#cluster-models article", has_text="chat-live")
    block.locator("tr.replica[data-state=ready]").wait_for(timeout=60_000)
    assert "1 of 1 ready" in block.inner_text()
    # The card it holds is shown as used on the node.
    watcher.locator(
        f"#cluster-node-{node.pk} [data-role=class-use]", has_text="1 free of 2"
    ).wait_for()

    # An operator cordons the node; the viewer's console shows it, with no buttons of its own.
    op.locator(f"#cluster-node-{node.pk} button", has_text="Cordon").click()
    watcher.locator(
        f"#cluster-node-{node.pk} [data-role=node-state]", has_text="cordoned"
    ).wait_for()
    assert watcher.locator(f"#cluster-node-{node.pk} button").count() == 0
    assert Node.objects.get(pk=node.pk).cordoned


def test_a_dropped_socket_reconnects_and_resynchronises(
    console: Callable[..., Any], agents: Callable[..., Agent], control_plane: ControlPlane,
    viewer: Any,
) -> None:  # fmt: skip
    agents("live-2", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="live-2", health="ready").first(), 30, "node")
    page = console(viewer)
    page.locator(f"#cluster-node-{node.pk}").wait_for()
    # However long the web process is away, the page tries again within 5 s (htmx's own
    # back-off grows to 64 s).
    waits = page.evaluate("[...Array(500).keys()].map(i => htmx.config.wsReconnectDelay(i % 12))")
    assert max(waits) <= 5000 and max(waits) > 2000

    # Every socket drops. While the web process is down, the node is cordoned: the page
    # missed the change and only the reconnect's snapshot can show it. (Cordoned after the
    # restart, a page reconnecting before the commit would see the node as it was, and
    # this process's in-memory channel layer tells the web process nothing.)
    from cluster import services

    control_plane.stop()
    page.wait_for_selector("[data-live-status].off")
    services.set_cordon(node, True)
    control_plane.start()
    page.wait_for_selector("[data-live-status].on", timeout=60_000)
    page.locator(f"#cluster-node-{node.pk} [data-role=node-state]", has_text="cordoned").wait_for()


def test_a_change_made_by_another_process_reaches_the_open_console(
    console: Callable[..., Any], agents: Callable[..., Agent], control_plane: ControlPlane,
    viewer: Any,
) -> None:  # fmt: skip
    """Embedded (no Redis), a command run in a terminal is heard through ``live.sock``."""
    agents("live-5", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="live-5", health="ready").first(), 30, "node")
    page = console(viewer)
    page.locator(f"#cluster-node-{node.pk}").wait_for()
    page.wait_for_selector("[data-live-status].on")
    page.evaluate(
        "window.__opens = 0; document.addEventListener('htmx:wsOpen', () => window.__opens++)"
    )

    # Another process on the same data folder and database: its channel layer is its own.
    code = (
        "from cluster import services; from cluster.models import Node; "
        f"services.set_cordon(Node.objects.get(pk={node.pk}), True)"
    )
    subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=ROOT, env=control_plane.env(), check=True, timeout=60, capture_output=True,
    )  # fmt: skip
    page.locator(f"#cluster-node-{node.pk} [data-role=node-state]", has_text="cordoned").wait_for()
    assert page.evaluate("window.__opens") == 0  # pushed, not picked up by a reconnect


def test_a_model_imported_from_a_terminal_is_placed_at_once(
    transactional_db: Any, tmp_path: Path
) -> None:
    """Embedded, ``catalog import`` in another process wakes the web process's reconciler
    through ``live.sock``: with an hour between its ticks, nothing else would place it."""
    from cluster.models import Assignment
    from tests.cluster.helpers import join_node

    hour = {"LLMGW_RECONCILE_INTERVAL": "3600", "LLMGW_NODE_LOST_AFTER": "3600"}
    plane = ControlPlane(tmp_path, extra=hour)
    plane.start()
    try:
        join_node("n-import", [L4])
        assert (tmp_path / "data" / "live.sock").exists()  # bound before it serves
        catalog = tmp_path / "catalog.yaml"
        catalog.write_text(
            yaml.safe_dump({"models": [samples.sim_model("imported", gpu_class=L4, tp=None)]})
        )
        subprocess.run(
            [sys.executable, "manage.py", "catalog", "import", str(catalog)],
            cwd=ROOT, env=plane.env(), check=True, timeout=60, capture_output=True,
        )  # fmt: skip
        wait_for(Assignment.objects.filter(replica__model_name="imported").exists, 30, "placement")
    finally:
        plane.stop()


def test_a_profile_on_a_class_with_too_few_free_cards_says_why(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any
) -> None:
    agents("live-3", "--simulate", f"2x {L4}")
    wait_for(lambda: Node.objects.filter(name="live-3", health="ready").first(), 30, "node")
    store(sim_model("wide", replicas=0))
    page = console(operator, "/catalog/models/wide/edit/")

    # The operator asks for one replica with tp 4 on nvidia-l4-24gb: the node has only 2.
    page.locator("input[name$='-tp']").first.fill("4")
    page.locator("input[name$='-gpus_per_node']").first.fill("4")
    page.locator("input[name='scaling_min']").fill("1")
    page.locator("button[type=submit]", has_text="Save").click()
    page.wait_for_url("**/catalog/models/wide/")
    page.wait_for_selector("[data-live-status].on")
    reason = page.locator(".live-replicas [data-role=reason]", has_text="needs 4")
    reason.wait_for(timeout=60_000)
    # No node of this cluster could ever hold it, and the reason says so first.
    assert reason.inner_text().strip() == (
        f"no node in this cluster can run it: needs 4 {L4} on one node; the largest node has 2"
    )


def test_enabling_a_sim_judge_shows_its_replica_go_from_pending_to_ready(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any, viewer: Any
) -> None:
    agents("live-4", "--simulate", f"1x {L4}")
    wait_for(lambda: Node.objects.filter(name="live-4", health="ready").first(), 30, "node")
    page = console(operator)
    watcher = console(viewer)
    # A viewer is not offered the form.
    assert watcher.locator("#cluster-enable-judge").count() == 0

    # Every state the judge's replica row shows in the viewer's page, in order.
    watcher.evaluate(SEEN_STATES, "llamaguard3-1b")
    page.locator("#cluster-enable-judge summary").click()
    form = page.locator("#cluster-enable-judge form")
    form.locator("select[name=name]").select_option("llamaguard3-1b")
    form.locator("input[name=where][value=sim]").check()
    form.locator("button[type=submit]").click()
    page.locator("#cluster-enable-judge [data-role=enable-outcome]").wait_for()

    # Its replica shows up pending, then ready, in both consoles, never reloaded.
    for p in (page, watcher):
        block = p.locator("#cluster-models article", has_text="llamaguard3-1b")
        block.locator("tr.replica[data-state=ready]").wait_for(timeout=60_000)
    seen = watcher.evaluate("window.__states")
    # It appeared before it was ready and moved forward only; how many of the states
    # before ready a push shows depends on how fast the node is (a loaded machine may
    # be starting it by the time the first push lands).
    order = ["pending", "starting", "loading", "ready"]
    assert seen[-1] == "ready" and seen[0] != "ready", seen
    assert [order.index(s) for s in seen] == sorted(order.index(s) for s in seen), seen
    # The judge's health block says it has a ready replica.
    watcher.locator(
        "#guard-judges [data-judge='llamaguard3-1b'] [data-role=judge-status]"
    ).wait_for()
    assert "no ready replica" not in watcher.inner_text(
        "#guard-judges [data-judge='llamaguard3-1b']"
    )


@pytest.mark.takes(48)
def test_an_evaluation_started_from_the_console_fills_in_without_reloading(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any
) -> None:
    from cluster.models import Replica
    from guard import enabling

    agents("live-5", "--simulate", f"1x {L4}")
    wait_for(lambda: Node.objects.filter(name="live-5", health="ready").first(), 30, "node")
    enabling.enable("qwen3guard-0.6b", "sim", add_to_policy=True, user=operator, surface="cli")
    wait_for(
        lambda: Replica.objects.filter(model_name="qwen3guard-0.6b", state="ready").exists(),
        60,
        "the judge's replica to be ready",
    )
    page = console(operator, "/guard/evals/")
    form = page.locator("#guard-eval-start form")
    assert form.locator("input[name=judges][value='qwen3guard-0.6b']").is_checked()
    form.locator("button[type=submit]").click()
    page.wait_for_url("**/guard/evals/*/")
    page.evaluate("window.__same_page = true")
    body = page.locator("#guard-eval-body[data-status=done]")
    body.wait_for(timeout=60_000)
    assert page.evaluate("window.__same_page") is True  # pushed, not reloaded
    row = body.locator("[data-role=eval-summary] tr[data-judge='qwen3guard-0.6b']")
    assert row.count() == 1 and "—" not in row.locator("td.num").nth(3).inner_text()
