"""Quotas in real Chromium: an operator sets a team's quota on the
Quotas page; the team's next replica waits pending with the quota named, on the Quotas
page, on the team's owner page and in the API; another team's model still places. No
console error, at 1280 and 390 px."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import reconciler
from cluster.models import Replica
from tests.browser.conftest import wait_js
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "nvidia-h100-80gb"


@pytest.mark.parametrize("width", [1280, 390])
def test_a_teams_spent_quota_is_named_in_the_console_and_the_api(
    open_page: Any, operator: Any, live_server: Any, api_for: Any, width: int
) -> None:
    join_node("n1", [H100] * 8)
    page = open_page(operator, "/cluster/quotas/", {"width": width, "height": 900})
    form = page.locator("#quota-form")
    form.locator("#id_owner").fill("team:search")
    form.locator("#id_cards").fill(f"{H100}=2")
    form.locator("button[type=submit]").click()
    page.locator('[data-quota="team:search"]').wait_for()
    assert "Quota of team:search" in page.locator(".messages").inner_text()
    # A bad one says which field, and writes nothing.
    page.locator("#quota-form #id_owner").fill("squad:x")
    page.locator("#quota-form button[type=submit]").click()
    wait_js(page, "document.querySelector('#quota-form').innerText.includes('is not org:ID')",
            what="the owner's error")  # fmt: skip
    # The refused form came back 400, which Chromium logs as a failed resource: expected.
    assert [e for e in page.errors if "400 (Bad Request)" not in e] == []
    page.errors.clear()
    store(gpu_model("search", owner="team:search", scaling={"min": 2, "max": 2}),
          gpu_model("chat", owner="team:chat", scaling={"min": 1, "max": 1}))  # fmt: skip
    reconciler.tick()
    assert Replica.objects.get(model_name="chat").assignments.count() == 1
    page.goto(f"{live_server.url}/cluster/quotas/")
    waiting = page.locator("#quota-waiting li[data-replica]")
    waiting.first.wait_for()
    text = waiting.first.inner_text()
    assert text.startswith("search #") and "quota of team:search spent: 2 of its 2" in text
    assert page.locator('[data-quota="team:search"][data-spent="1"]').count() == 1
    page.locator('[data-quota="team:search"] a', has_text="team:search").click()
    page.wait_for_url(f"{live_server.url}/cluster/owners/team:search/")
    reasons = page.locator('#owner-replicas [data-role="reason"]').all_inner_texts()
    assert any("quota of team:search spent" in r for r in reasons), reasons
    assert any(r.startswith("placed on n1") for r in reasons), reasons
    assert page.errors == []
    replicas = api_for(operator).get("/api/v1/cluster/replicas/").json()["results"]
    told = {r["model_name"]: r["reason"] for r in replicas if r["state"] == "pending"}
    assert "quota of team:search spent" in told.get("search", ""), told
