"""An update from the console, in Chromium, against a real web process and agent.

The web process (``manage.py serve``: its reconciler moves the update at every tick, its
threads run the mirror's fetch and the eval), one simulated node whose agent runs sim
engines from the mirror, the Hub stand-in as the registry. An operator opens the model's
page, presses Update, watches each step's line arrive in the panel (the fetch, the
candidate, the eval's score), promotes, then rolls back; a viewer sees the states on the
model's page and the Updates page, and no button.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog.services import stored_specs
from cluster.models import Node, Replica
from tests.browser.conftest import wait_js
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import ControlPlane, wait_for
from tests.e2e.faultplane import FAST, H100
from tests.updates.hubstandin import HubStandIn
from updates import mirror
from updates.models import UpdateRun

pytestmark = [pytest.mark.e2e]

REPO = "acme/chat"


@pytest.fixture
def hub() -> Iterator[HubStandIn]:
    with HubStandIn() as stand_in:
        yield stand_in


@pytest.fixture
def control_plane(
    transactional_db: Any, tmp_path: Path, hub: HubStandIn, settings: Any
) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path)
    mirror_dir = tmp_path / "mirror"
    cp.extra.update(
        HF_ENDPOINT=hub.url,
        LLMGW_MIRROR_DIR=str(mirror_dir),
        LLMGW_MIRROR_HOSTS=hub.url,
        LLMGW_GATEWAY_URL=cp.url,
    )
    settings.HF_ENDPOINT = hub.url
    settings.LLMGW_MIRROR = True
    settings.LLMGW_MIRROR_DIR = mirror_dir
    settings.LLMGW_MIRROR_HOSTS = [hub.url]
    cp.start()
    yield cp
    cp.stop()


def weights(name: str, **figures: float) -> bytes:
    return json.dumps({"llmgw-sim-weights": 1, "name": name, **figures}).encode()


def panel_text(page: Any) -> str:
    return page.locator("#updates-panel").inner_text()


def test_an_operator_updates_watches_each_step_and_rolls_back_a_viewer_sees_no_button(
    control_plane: ControlPlane,
    agents: Any,
    hub: HubStandIn,
    console: Any,
    operator: Any,
    viewer: Any,
) -> None:
    first = hub.commit(REPO, {"sim-weights.json": weights("v1", arithmetic=0.0)})
    agents("console-node", "--simulate", f"4x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("chat", source=REPO, profile={"env": dict(FAST)},
                    eval={"suite": "arithmetic", "min_score": 0.8}))  # fmt: skip
    f = mirror.request_fetch("chat", by="test", surface="cli", start=False)
    assert mirror.run_fetch(f.pk).state == "done"
    wait_for(lambda: Replica.objects.filter(model_name="chat", state="ready").exists(), 120,
             "chat ready")  # fmt: skip
    better = hub.commit(REPO, {"sim-weights.json": weights("better")})

    page = console(operator, "/catalog/models/chat/")
    page.wait_for_selector("[data-role=update-start]", timeout=30_000)
    page.click("[data-role=update-start]")
    # The panel says it started; it is asked for again every 2 s while the update runs.
    page.wait_for_selector("[data-role=update-run]")
    assert "started by" in page.locator("[data-role=update-run]").inner_text()
    # A viewer's Updates page, open (and live) while the update runs.
    listing = console(viewer, "/updates/")
    seen: set[str] = set()

    def steps() -> bool:
        seen.update(page.locator("[data-role=update-lines] li").evaluate_all(
            "els => els.map(e => e.dataset.step)"))  # fmt: skip
        return page.locator("[data-role=update-promote]").count() > 0 and "ready" in (
            page.locator("[data-role=update-run-state]").inner_text()
        )

    def why() -> str:
        r = UpdateRun.objects.first()
        return f"{r.state} at {r.step}: {r.reason}; {r.lines}" if r else "no update"

    try:
        wait_for(steps, 240, "the panel to show the update ready to promote")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the update: {why()}") from None
    steps()  # the lines as the panel shows them now (it may have been swapped mid-look)
    assert {"fetch", "candidate", "eval", "promote"} <= seen, seen
    text = panel_text(page)
    assert "eval arithmetic: score 1.00" in text and "ready to promote" in text
    r = UpdateRun.objects.get()
    assert r.started_by == f"{operator.username} (console)" and r.surface == "console"

    page.click("[data-role=update-promote]")
    wait_js(page, "document.querySelector('[data-role=update-lines]')?.textContent.includes('promoted to')",
            timeout=30, what="the promote's line")  # fmt: skip

    assert stored_specs(names=["chat"])[0].origin.revision == better

    # A viewer sees the state and no button, on the model's page and the Updates page.
    seen_by_viewer = console(viewer, "/catalog/models/chat/")
    seen_by_viewer.wait_for_selector("[data-role=update-flow]")
    assert seen_by_viewer.locator("[data-role=update-run-state]").inner_text() == "promoted"
    for role in ("update-start", "update-promote", "update-rollback", "check-updates"):
        assert seen_by_viewer.locator(f"[data-role={role}]").count() == 0, role
    wait_js(listing, "document.querySelector('tr[data-model=chat]')?.dataset.state === 'promoted'",
            timeout=30, what="the viewer's Updates page to show chat promoted")  # fmt: skip
    assert listing.locator("[data-live-status].on").count() == 1
    listing.select_option("[data-role=filter-state]", "failed")
    listing.click("form[data-role=update-filters] button")
    listing.wait_for_url("**/updates/?q=&state=failed")
    assert listing.locator("tr[data-model=chat]").count() == 0

    page.on("dialog", lambda d: d.accept())
    page.wait_for_selector("[data-role=update-rollback]")
    # What the rollback says is in its answer, swapped into the panel; the panel's own
    # refresh (every few seconds, and at the model's change) may replace it at once, so
    # the answer is read as it arrives, and the panel is then held to the revision.
    with page.expect_response(lambda r: r.url.endswith("/chat/rollback/")
                              and r.request.method == "POST", timeout=60_000) as answer:  # fmt: skip
        page.click("[data-role=update-rollback]")
    assert answer.value.status == 200
    assert f"chat is back at {first[:8]}" in answer.value.text()
    assert stored_specs(names=["chat"])[0].origin.revision == first
    wait_js(page, f"document.querySelector('[data-role=origin] code')?.title === '{first}'",
            timeout=30, what="the panel to show the origin back at the first revision")  # fmt: skip
