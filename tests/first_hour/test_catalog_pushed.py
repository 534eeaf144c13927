"""An operator's first hour: catalog changes reach the open consoles without a reload.

A real Chromium against a real ``manage.py serve`` and a simulated agent; the changes are
made through the API, as a script would, while the pages stay open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cluster.models import Node, Replica
from llmgw_core.models import ApiToken
from tests.catalog.samples import sim_model
from tests.e2e.conftest import Agent, ControlPlane, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

L4 = "nvidia-l4-24gb"


def _model(name: str, priority: int = 0) -> dict[str, Any]:
    # A priority is part of the profile's fingerprint.
    profile = {"priority": priority} if priority else None
    return sim_model(name, gpu_class=L4, tp=None, profile=profile)


def test_catalog_changes_made_through_the_api_reach_open_consoles(
    console: Callable[..., Any],
    agents: Callable[..., Agent],
    control_plane: ControlPlane,
    operator: Any,
    viewer: Any,
) -> None:
    agents("push-1", "--simulate", f"2x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="push-1", health="ready").first(), 30, "node")
    op = console(operator)
    watcher = console(viewer)
    logged: list[str] = []
    for page in (op, watcher):
        page.on("console", lambda m: logged.append(m.text))
    _, secret = ApiToken.issue(operator, "push-test")
    api = httpx.Client(
        base_url=control_plane.url + "/api/v1/catalog/",
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )

    # Two models created: each appears in both consoles, and the empty line hides.
    for name in ("pushed-a", "pushed-b"):
        assert api.post("models/", json=_model(name)).status_code == 201
    for page in (op, watcher):
        for name in ("pushed-a", "pushed-b"):
            page.locator("#cluster-models article", has_text=name).locator(
                "tr.replica[data-state=ready]"
            ).wait_for(timeout=60_000)
        assert not page.locator("#cluster-models-empty").is_visible()

    # Its profile changed: the replica runs an old definition, which both consoles mark,
    # and the operator's offers to roll.
    assert api.put("models/pushed-a/", json=_model("pushed-a", 5)).status_code == 200
    for page in (op, watcher):
        block = page.locator("#cluster-models article", has_text="pushed-a")
        block.locator(".badge.outdated", has_text="old definition").first.wait_for()
    op.locator("#cluster-models article", has_text="pushed-a").locator(
        "button", has_text="Roll"
    ).wait_for()
    assert watcher.locator("#cluster-models article", has_text="pushed-a button").count() == 0

    # Deleted: it leaves both consoles; the other stays.
    assert api.delete("models/pushed-a/").status_code == 204
    for page in (op, watcher):
        page.locator("#cluster-models article", has_text="pushed-a").wait_for(
            state="detached", timeout=60_000
        )
        assert page.locator("#cluster-models article", has_text="pushed-b").count() == 1
    wait_for(
        lambda: not Replica.objects.filter(model_name="pushed-a").exists(), 60, "replicas gone"
    )
    assert node.pk and not [m for m in logged if "oobErrorNoTarget" in m], logged


def test_a_cordoned_or_drained_node_says_so_and_who(
    console: Callable[..., Any], agents: Callable[..., Agent], operator: Any, viewer: Any
) -> None:
    agents("why-1", "--simulate", f"1x {L4}")
    node = wait_for(lambda: Node.objects.filter(name="why-1", health="ready").first(), 30, "node")
    op = console(operator)
    watcher = console(viewer)
    card = f"#cluster-node-{node.pk}"
    op.locator(f"{card} button", has_text="Cordon").click()
    reason = watcher.locator(f"{card} [data-role=node-reason]")
    reason.wait_for()
    assert reason.inner_text().strip() == f"cordoned by {operator.username} (console)"
    op.locator(f"{card} button", has_text="Uncordon").click()
    reason.wait_for(state="detached")
    op.once("dialog", lambda d: d.accept())
    op.locator(f"{card} button", has_text="Drain").click()
    watcher.locator(f"{card} [data-role=node-reason]", has_text="drained by").wait_for()
    assert "joined" not in watcher.locator(card).inner_text()
