"""The catalog list's ready column, live: in a real Chromium against a real
control plane, a replica a real agent's sim engine brings to ready changes the cell of
its model from 0/1 to 1/1 without a reload; a model the list's filters leave out gets
nothing pushed (htmx would say it found no target), and the console says nothing."""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest

from cluster.models import Node, Replica
from tests.catalog import samples
from tests.catalog.samples import store
from tests.e2e.conftest import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"


sim_model = partial(samples.sim_model, gpu_class=L4)


def test_a_replica_becoming_ready_changes_its_models_ready_cell(
    console: Any, agents: Any, viewer: Any
) -> None:
    store(sim_model("ready-live"), sim_model("hidden-live"))
    page = console(viewer, "/catalog/")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type in ("error", "warning") else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    cell = page.locator("#served-model-table [data-role=ready]").first
    assert page.locator("#served-model-table th", has_text="ready").count() == 1
    # Filtered to one model: the socket opens again with the filter.
    page.fill("input[name=search]", "ready-live")
    page.locator("#served-model-table p.count", has_text="1 model").wait_for()
    page.wait_for_selector("[data-live-status].on")
    page.evaluate(
        "window.__cells = []; new MutationObserver(() => {"
        " const c = document.querySelector('#served-model-table [data-role=ready]');"
        " if (c && window.__cells[window.__cells.length - 1] !== c.textContent)"
        "   window.__cells.push(c.textContent);"
        "}).observe(document.body, {childList: true, subtree: true, characterData: true})"
    )
    assert cell.inner_text() == "0/1"  # no node yet: wanted, not placed

    agents("ready-1", "--simulate", f"2x {L4}")
    wait_for(lambda: Node.objects.filter(name="ready-1").exists(), 60, "the agent to join")
    cell.filter(has_text="1/1").wait_for(timeout=90_000)
    assert page.evaluate("window.__cells")[-1] == "1/1"
    assert page.locator("#served-model-table [data-role=ready]").count() == 1
    # The other model became ready too; its cell was not pushed to this page.
    hidden = Replica.objects.filter(model_name="hidden-live", state="ready")
    wait_for(hidden.exists, 90, "the other model ready")
    page.fill("input[name=search]", "")
    page.locator("#served-model-table p.count", has_text="2 models").wait_for()
    cells = page.locator("#served-model-table [data-role=ready]").all_inner_texts()
    assert cells == ["1/1", "1/1"]  # hidden-live, ready-live: rendered again, by name
    assert errors == [], errors
