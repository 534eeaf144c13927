# ruff: noqa: F811  (the control plane fixtures are imported from tests/e2e)
"""The dashboard of a site with more nodes and models than a page holds, in Chromium
against `manage.py serve`: the counts of the whole site, a page of each list with its
pages, and a change pushed live to the page that shows the node, never to one that
does not (a large site's every block took seconds to render: docs/console.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from tests.e2e.conftest import ControlPlane, chromium, console  # noqa: F401

pytestmark = [pytest.mark.e2e]

NODES = 120  # three pages of 50
MODELS = 120
L4 = "nvidia-l4-24gb"


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path) -> Iterator[ControlPlane]:
    """The web process; nodes never heard from stay ready (they have no agent)."""
    cp = ControlPlane(tmp_path, extra={"LLMGW_NODE_LOST_AFTER": "3600"})
    cp.start()
    yield cp
    cp.stop()


def a_large_site() -> dict[str, Any]:
    """Store 120 nodes of two L4 cards and 120 models of one replica each, placed."""
    from catalog import codec, services
    from catalog.choices import Surface
    from cluster import reconciler
    from cluster.choices import NodeHealth
    from cluster.models import Card, Node
    from tests.catalog.samples import gpu_model

    now = timezone.now()
    nodes = Node.objects.bulk_create(
        Node(name=f"n{i:03d}", cpu_cores=16, memory_mb=64_000, disk_free_mb=500_000,
             engines={"vllm": "0.11.0"}, health=NodeHealth.READY, last_heartbeat=now)
        for i in range(NODES)
    )  # fmt: skip
    Card.objects.bulk_create(
        Card(node=n, index=i, gpu_class=L4, memory_mb=24_000) for n in nodes for i in range(2)
    )
    models = []
    for i in range(MODELS):
        m, problems = codec.decode_model(gpu_model(
            f"m{i:03d}", profiles=[{"name": "l4", "engine": "vllm", "gpu_class": L4}],
            scaling={"min": 1, "max": 1},
        ))  # fmt: skip
        assert not problems, problems
        models.append(m)
    services.import_catalog(models, services.Actor(user=None, surface=Surface.CLI, name="t"))
    reconciler.tick()
    return {n.name: n for n in nodes}


def test_a_large_sites_dashboard_counts_everything_pages_its_lists_and_stays_live(
    console: Callable[..., Any], control_plane: ControlPlane, operator: Any
) -> None:
    from llmgw_core.models import ApiToken

    nodes = a_large_site()
    page = console(operator)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    # The counts are the whole site's; each list shows its first page.
    summary = page.locator("#cluster-summary")
    assert summary.locator('[data-count="nodes"]').inner_text() == str(NODES)
    assert summary.locator('[data-count="models"]').inner_text() == str(MODELS)
    assert page.locator("#cluster-nodes article.node").count() == 50
    assert page.locator("#cluster-models article.model").count() == 50
    assert page.locator('[data-role="nodes-range"]').inner_text() == f"1–50 of {NODES}"
    assert page.locator('[data-role="nodes-pager"] [data-role="page-of"]').first.inner_text() == (
        "page 1 of 3"
    )
    assert page.locator('[data-role="catalog-link"]').get_attribute("href") == "/catalog/"

    # The next page of nodes: the address follows, and the socket opens again for it.
    page.locator('[data-role="nodes-pager"] a[rel="next"]').first.click()
    page.wait_for_url("**/cluster/?nodes_page=2&models_page=1")
    page.locator('[data-role="nodes-range"]', has_text=f"51–100 of {NODES}").wait_for()
    page.wait_for_selector("[data-live-status].on")
    shown = page.locator("#cluster-nodes article.node")
    assert shown.count() == 50
    assert shown.first.get_attribute("data-node") == "n050"
    assert page.locator(f"#cluster-node-{nodes['n000'].pk}").count() == 0

    # A cordon through the API: the node this page shows says so, and the counts too.
    _, secret = ApiToken.issue(operator, "dashboard")
    for name in ("n060", "n001"):
        r = httpx.post(
            f"{control_plane.url}/api/v1/cluster/nodes/{name}/cordon/",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
    card = page.locator(f"#cluster-node-{nodes['n060'].pk}")
    card.locator("[data-role=node-state]", has_text="cordoned").wait_for(timeout=10_000)
    page.locator('#cluster-summary [data-count="nodes-cordoned"]', has_text="2 cordoned").wait_for(
        timeout=10_000
    )
    page.locator('#cluster-summary [data-attention="nodes"]').wait_for()
    # The node of another page is counted, not added to this one.
    assert page.locator(f"#cluster-node-{nodes['n001'].pk}").count() == 0
    assert shown.count() == 50
    assert page.inner_text("[data-live-status]") == "live"
    assert errors == [], errors

    # Opened again, the cordoned nodes come first: what needs attention leads the list.
    page.goto(control_plane.url + "/cluster/")
    first = page.locator("#cluster-nodes article.node")
    assert [first.nth(0).get_attribute("data-node"), first.nth(1).get_attribute("data-node")] == [
        "n001",
        "n060",
    ]
