"""The node page and an engine's log with a real agent and a real sim engine that crashes
: its last lines reach the control plane with the agent's reports and
are shown to operators, walked in Chromium at 1280 and 390 px with console errors
collected."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.enginekeys import engine_key
from cluster.models import Assignment, Node
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import Agent, ControlPlane, wait_for

pytestmark = pytest.mark.e2e

H100 = "nvidia-h100-80gb"
CRASH = "error: argument --load-time: invalid"


def test_a_crashing_sim_engines_last_lines_are_on_its_nodes_page_and_its_log(
    control_plane: ControlPlane, agents: Any, console: Any, operator: Any
) -> None:
    agent: Agent = agents("sim-1", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(name="sim-1").exists(), 60, "the agent to join")
    # The sim engine's own argument parser refuses the value: it exits with code 2 and
    # its usage and error on stderr, as a real engine's crash at start does.
    store(sim_model("crashy", gpu_class=H100, profile={"args": ["--load-time", "soon"]}))

    def crashed() -> Assignment | None:
        a = Assignment.objects.filter(replica__model_name="crashy").first()
        return a if a is not None and any(CRASH in line for line in a.log) else None

    share = wait_for(crashed, 90, "the engine's crash lines reported")
    rid = share.replica_id
    assert not any(engine_key(rid) in line for line in share.log)
    node = Node.objects.get(name="sim-1")
    assert node.agent_version  # the agent's own, from its inventory

    for viewport in ({"width": 1280, "height": 1000}, {"width": 390, "height": 844}):
        page = console(operator, "/cluster/")
        page.set_viewport_size(viewport)
        errors: list[str] = []
        page.on(
            "console",
            lambda m, errors=errors: errors.append(m.text)
            if m.type in ("error", "warning")
            else None,
        )
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.locator(f"#cluster-node-{node.pk} a[data-role=node-page]").click()
        page.wait_for_url(f"**/cluster/nodes/{node.pk}/")
        assert page.locator("[data-role=agent-version]").inner_text() == (
            f"llmgw-agent {node.agent_version}"
        )
        row = page.locator(f"#node-replicas tr[data-replica='{rid}']")
        row.wait_for()
        assert "crashy" in row.inner_text()
        row.locator("a[data-role=log-link]").click()
        page.wait_for_url(f"**/cluster/replicas/{rid}/log/")
        page.locator("pre[data-role=log] span", has_text=CRASH).first.wait_for()
        wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 1, f"the log page is {wide} px wider than {viewport['width']} px"
        assert errors == [], errors
        page.close()
    assert agent.proc.poll() is None
