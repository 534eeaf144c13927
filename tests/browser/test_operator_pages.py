"""The operators' pages GPUStack and LiteLLM users looked for, in a real
Chromium under the pages' real CSP: a node's page, a replica's engine log, usage on the
Keys page, Try/Scale/Wake on a model's page, the copy button of a new key. Each page is
walked at 1280 and 390 px with its console errors collected."""

from __future__ import annotations

from typing import Any

import pytest

from cluster import reconciler
from cluster.models import Assignment, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "nvidia-h100-80gb"
WIDE = {"width": 1280, "height": 1000}
PHONE = {"width": 390, "height": 844}


def fits(page: Any) -> None:
    """The page is no wider than its viewport (nothing to scroll sideways)."""
    wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 1, f"the page is {wide} px wider than the viewport"


def placed_node() -> tuple[Any, int]:
    node, _ = join_node("gpu-1", [H100, H100, H100], agent_version="0.9.1")
    store(gpu_model("chat", scaling={"min": 1, "max": 1}))
    reconciler.tick()
    rid = Replica.objects.get(model_name="chat").pk
    Assignment.objects.filter(replica_id=rid).update(
        state="failed",
        reason="exited with code 1: CUDA out of memory; restarting in 8 s",
        log=["--- generation 1: ['vllm', 'serve']", "loading", "CUDA out of memory"],
    )
    Replica.objects.filter(pk=rid).update(state="failed")
    return node, rid


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_a_nodes_page_shows_its_cards_replicas_agent_and_the_engines_log(
    open_page: Any, operator: Any, viewport: dict[str, int]
) -> None:
    node, rid = placed_node()
    page = open_page(operator, "/cluster/", viewport)
    page.locator(f"#cluster-node-{node.pk} a[data-role=node-page]").click()
    page.wait_for_url(f"**/cluster/nodes/{node.pk}/")
    assert page.locator("[data-role=agent-version]").inner_text() == "llmgw-agent 0.9.1"
    held = page.locator("#node-cards [data-role=held-by]").all_inner_texts()
    assert held == [f"chat #{rid}", f"chat #{rid}", "free"]
    row = page.locator(f"#node-replicas tr[data-replica='{rid}']")
    assert row.locator("[data-role=replica-state]").inner_text() == "failed"
    assert "CUDA out of memory" in row.inner_text()
    fits(page)
    row.locator("a[data-role=log-link]").click()
    page.wait_for_url(f"**/cluster/replicas/{rid}/log/")
    lines = page.locator("pre[data-role=log] span").all_inner_texts()
    assert lines[-1] == "CUDA out of memory"
    fits(page)
    # A later report's lines reach the open page without a reload.
    Assignment.objects.filter(replica_id=rid).update(log=["restarted", "ready at last"])
    page.locator("pre[data-role=log] span", has_text="ready at last").wait_for(timeout=20_000)
    assert page.locator("pre[data-role=log] span").all_inner_texts() == [
        "restarted",
        "ready at last",
    ]
    assert page.errors == []


def test_a_viewer_sees_a_nodes_page_but_not_an_engines_log(
    open_page: Any, viewer: Any, live_server: Any
) -> None:
    node, rid = placed_node()
    page = open_page(viewer, f"/cluster/nodes/{node.pk}/")
    row = page.locator(f"#node-replicas tr[data-replica='{rid}']")
    assert "CUDA out of memory" in row.inner_text()
    assert page.locator("a[data-role=log-link]").count() == 0
    answer = page.goto(f"{live_server.url}/cluster/replicas/{rid}/log/")
    assert answer is not None and answer.status == 403
    assert "CUDA out of memory" not in page.content()


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_the_keys_page_shows_each_keys_usage_today_and_when_it_was_last_used(
    open_page: Any, viewer: Any, viewport: dict[str, int]
) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from gateway import services
    from gateway.models import Usage
    from gateway.views import today_start

    services.create_key("busy-app", owner="team:busy", via="test")
    services.create_key("idle-app", via="test")
    start = today_start()
    now = timezone.now().replace(second=0, microsecond=0)
    for minute, model, n, tin, tout in [
        (now, "chat", 3, 100, 20),
        (now - timedelta(minutes=1), "other", 2, 10, 5),
        (start - timedelta(minutes=1), "chat", 50, 1000, 1000),  # yesterday: not counted
    ]:
        Usage.objects.create(
            minute=minute, key="busy-app", model=model, requests=n, tokens_in=tin, tokens_out=tout
        )
    page = open_page(viewer, "/gateway/keys/", viewport)
    busy = page.locator("tr[data-key='busy-app']")
    assert busy.locator("[data-role=today]").inner_text() == "5 requests, 135 tokens, 0 % cached"
    assert busy.locator("[data-role=last-used] time").get_attribute("datetime") == now.isoformat()
    idle = page.locator("tr[data-key='idle-app']")
    assert idle.locator("[data-role=today]").inner_text() == "0 requests, 0 tokens"
    assert idle.locator("[data-role=last-used]").inner_text() == "never"
    # Each owner links its page; a key without one says so.
    owner = busy.locator("a[data-role=owner]")
    assert owner.inner_text() == "team:busy"
    assert owner.get_attribute("href") == "/cluster/owners/team:busy/"
    assert idle.locator("a[data-role=owner]").count() == 0
    fits(page)
    owner.click()
    page.wait_for_url("**/cluster/owners/team:busy/")
    assert page.errors == []


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_a_new_key_is_copied_by_its_copy_button(
    open_page: Any, operator: Any, viewport: dict[str, int]
) -> None:
    page = open_page(operator, "/gateway/keys/", viewport)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.fill("#id_name", "copied-app")
    page.click("#key-form button[type=submit]")
    secret = page.locator("#key-secret").inner_text().strip()
    # The button's script runs once the new page is parsed (a click before it did nothing: a
    # full run on a loaded machine clicked first and waited 30 s for "Copied.").
    page.wait_for_load_state("domcontentloaded")
    assert secret.startswith("llmgw-ck-")
    page.locator("button[data-role=copy]").click()
    page.locator("[data-role=copied]", has_text="Copied.").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == secret
    # Said on the button itself, where the eye is, then back to Copy.
    page.locator("button[data-role=copy].copied", has_text="Copied ✓").wait_for()
    page.locator("button[data-role=copy]:not(.copied)", has_text="Copy").wait_for()
    fits(page)
    assert page.errors == []


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_a_models_page_tries_it_in_chat_scales_it_and_wakes_it(
    open_page: Any, operator: Any, viewport: dict[str, int]
) -> None:
    from catalog.models import ChangeRecord, ServedModel
    from cluster.models import ClusterAction, ModelDemand

    store(gpu_model("sleepy", scaling={"min": 0, "max": 1, "idle_timeout": "10m"}))
    page = open_page(operator, "/catalog/models/sleepy/", viewport)
    fits(page)
    # Wake: demand recorded as the API's call records it, logged with who did it.
    page.locator("button[data-role=wake]").click()
    page.locator(".messages", has_text="Asked for sleepy").wait_for()
    assert ModelDemand.objects.filter(model_name="sleepy").exists()
    assert ClusterAction.objects.filter(action="wake", target="model sleepy").get().actor_name == (
        "otto (console)"
    )
    # Scale: through the catalog's write path, in its change log.
    page.fill("#scale-min", "1")
    page.fill("#scale-max", "3")
    page.locator("button[data-role=scale]").click()
    page.locator(".messages", has_text="Scaled sleepy: min 0 → 1, max 1 → 3").wait_for()
    scaling = ServedModel.objects.get(name="sleepy").to_spec().scaling
    assert (scaling.min, scaling.max) == (1, 3)
    assert ChangeRecord.objects.filter(model_name="sleepy").count() == 2
    # A min above its max is refused by the rules, saying where, and changes nothing.
    page.fill("#scale-min", "5")
    page.fill("#scale-max", "2")
    page.locator("button[data-role=scale]").click()
    page.locator(".messages", has_text="Not scaled:").wait_for()
    assert page.locator(".messages").inner_text() == (
        "Not scaled: scaling.max: scaling max 2 is below min 5: raise max or lower min."
        " Nothing changed."
    )
    scaling = ServedModel.objects.get(name="sleepy").to_spec().scaling
    assert (scaling.min, scaling.max) == (1, 3)
    # Try: Chat opens with the model chosen.
    page.locator("a[data-role=try]").click()
    page.wait_for_url("**/gateway/chat/?model=sleepy")
    assert page.locator("#chat-model").input_value() == "sleepy"
    fits(page)
    assert page.errors == []


def test_a_viewer_may_try_a_model_but_neither_scale_nor_wake_it(
    open_page: Any, viewer: Any, live_server: Any
) -> None:
    from catalog.models import ServedModel
    from cluster.models import ModelDemand

    store(gpu_model("sleepy", scaling={"min": 0, "max": 1, "idle_timeout": "10m"}))
    page = open_page(viewer, "/catalog/models/sleepy/")
    assert page.locator("a[data-role=try]").count() == 1
    assert page.locator("button[data-role=wake], button[data-role=scale]").count() == 0
    # The endpoints refuse a viewer's post (with a valid CSRF token), changing nothing.
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    for action, form in (("wake", {}), ("scale", {"min": "2", "max": "2"})):
        answer = page.request.post(
            f"{live_server.url}/cluster/models/sleepy/{action}/",
            form=form,
            headers={"X-CSRFToken": token, "Referer": live_server.url},
        )
        assert answer.status == 403, (action, answer.status)
    assert not ModelDemand.objects.exists()
    scaling = ServedModel.objects.get(name="sleepy").to_spec().scaling
    assert (scaling.min, scaling.max) == (0, 1)


def test_a_new_join_token_is_copied_by_its_copy_button(open_page: Any, admin_user: Any) -> None:
    page = open_page(admin_user, "/tokens/", PHONE)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.fill("#id_join-name", "rack-7")
    page.click("#join-token-form button[type=submit]")
    secret = page.locator("#token-secret").inner_text().strip()
    # The button's script runs once the new page is parsed (a click before it did nothing: a
    # full run on a loaded machine clicked first and waited 30 s for "Copied.").
    page.wait_for_load_state("domcontentloaded")
    assert secret.startswith("llmgw_join_")
    page.locator("button[data-role=copy]").click()
    page.locator("[data-role=copied]", has_text="Copied.").wait_for()
    assert page.evaluate("navigator.clipboard.readText()") == secret
    fits(page)
    assert page.errors == []


@pytest.mark.parametrize("viewport", [WIDE, PHONE], ids=["1280", "390"])
def test_a_models_an_owners_and_the_keys_page_chart_their_traffic_in_place(
    open_page: Any, operator: Any, viewport: dict[str, int]
) -> None:
    """Issue 20, item 5: charts on a model's page and an owner's page (not only links),
    with load scaling's steps marked and a span switched in place."""
    import datetime as dt

    from cluster import services
    from gateway.models import TrafficPoint, Usage

    store(gpu_model("charted", scaling={"min": 1, "max": 2}))
    now = dt.datetime.now(dt.UTC).replace(second=0, microsecond=0)
    TrafficPoint.objects.create(resolution="minute", model="charted", at=now, requests=7,
                                tokens_out=70)  # fmt: skip
    Usage.objects.create(minute=now, key="app", owner="team:charts", model="charted",
                         requests=7, tokens_out=70)  # fmt: skip
    services.log_action(None, "scaled up", "model charted", "scaled up to 2: 9 in flight",
                        via="load scaling")  # fmt: skip
    page = open_page(operator, "/catalog/models/charted/", viewport)
    section = page.locator("#history-model-charted")
    section.locator("figure[data-series=requests]").wait_for()
    mark = section.locator("figure[data-series=requests] line.mark-scale title")
    assert mark.text_content() == "scale: scaled up: scaled up to 2: 9 in flight"
    # Nothing refused in the span: that chart says so rather than drawing a flat line.
    assert (
        section.locator("figure[data-series='TTFT p99 (ms)'] [data-role=no-traffic]").count() == 1
    )
    section.locator("a", has_text="hour").click()
    page.locator("#history-model-charted strong", has_text="hour").wait_for()
    assert page.url.endswith("/catalog/models/charted/")  # switched in place
    fits(page)
    assert page.errors == []

    owner = open_page(operator, "/cluster/owners/team:charts/", viewport)
    charts = owner.locator("#history-owner-team-charts")
    charts.locator("figure[data-series=requests]").wait_for()
    assert charts.locator("figure[data-series='tokens out'] [data-role=no-traffic]").count() == 0
    fits(owner)
    assert owner.errors == []

    # The Keys page: a key's "over time" shows its charts below the keys, in place.
    from gateway import services as keys

    keys.create_key("app", via="test")
    listing = open_page(operator, "/gateway/keys/", viewport)
    listing.locator("tr[data-key=app] a[data-role=key-history]").click()
    listing.locator("#key-history #history-key-app figure[data-series=requests]").wait_for()
    assert listing.url.endswith("/gateway/keys/")
    fits(listing)
    assert listing.errors == []
