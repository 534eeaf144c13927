"""The console's details in a real Chromium: labels, widths, messages, favicon, phones, tokens.

Each test is one point an operator met in the first hour.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.utils import timezone

from cluster.models import ClusterAction, JoinToken, Node
from guard.models import EvalResult, EvalRun
from llmgw_core.models import ApiToken
from tests.browser.conftest import PASSWORD
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node
from tests.guard.helpers import guard_model

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "nvidia-h100-80gb"
PHONE = {"width": 390, "height": 844}


@pytest.fixture
def open_page(browser: Any, live_server: Any) -> Iterator[Callable[..., Any]]:
    """Return a function opening a page signed in as a user, at a given viewport."""
    contexts = []

    def open_as(user: Any, path: str, viewport: dict[str, int] | None = None) -> Any:
        context = browser.new_context(viewport=viewport or {"width": 1400, "height": 1000})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto(f"{live_server.url}/login/?next={path}")
        page.fill("#id_username", user.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}{path}")
        return page

    yield open_as
    for context in contexts:
        context.close()


def test_pp_shows_what_the_rules_mean(open_page: Any, operator: Any) -> None:
    store(gpu_model("wide"))  # tp 2, pp left out: the rules read it as 1
    page = open_page(operator, "/catalog/models/wide/")
    row = page.locator("table.profiles tr", has=page.locator("th.key", has_text="pp"))
    assert row.locator("td").inner_text().strip() == "1"
    page.goto(page.url + "edit/")
    box = page.locator("#id_profiles-0-pp")
    assert box.input_value() == "" and box.get_attribute("placeholder") == "1"


def test_labels_stay_the_catalogs_names_after_a_refused_save(open_page: Any, operator: Any) -> None:
    store(gpu_model("labelled"))
    page = open_page(operator, "/catalog/models/labelled/edit/")
    labels = ["gpu_class", "tp", "pp", "gpus_per_node", "nodes"]

    def shown() -> list[str]:
        return [page.locator(f"label[for=id_profiles-0-{n}]").inner_text() for n in labels]

    assert shown() == labels
    page.fill("#id_profiles-0-tp", "3")  # 2 cards (tp 2 before) no longer match tp 3
    page.fill("#id_profiles-0-gpus_per_node", "2")
    page.click("button[type=submit]:text('Save')")
    page.locator("#form-status", has_text="problem").wait_for()
    assert page.locator("#err-profiles-0-tp").inner_text().strip()
    assert shown() == labels
    assert page.locator("label[for=id_scaling_min]").inner_text() == "scaling.min"


def test_a_window_with_min_above_max_says_so_as_it_is_typed(open_page: Any, operator: Any) -> None:
    store(
        gpu_model(
            "windowed",
            scaling={
                "min": 0,
                "max": 2,
                "schedule": [{"days": ["mon"], "from": "08:00", "to": "18:00", "min": 1, "max": 2}],
            },
        )
    )
    for path in ("/catalog/models/windowed/schedule/", "/catalog/models/windowed/edit/"):
        page = open_page(operator, path)
        page.locator("#id_windows-0-min").select_text()
        page.keyboard.type("15")  # above max 2; the box is not left
        page.locator("#err-windows-0-max", has_text="min 15 and max 2").wait_for()
        assert page.evaluate("document.activeElement.id") == "id_windows-0-min", path


def test_saves_and_deletes_are_confirmed_on_the_next_page(open_page: Any, operator: Any) -> None:
    store(gpu_model("confirmed"))
    page = open_page(operator, "/catalog/models/confirmed/edit/")
    page.fill("#id_description", "now described")
    page.click("button[type=submit]:text('Save')")
    page.wait_for_url("**/catalog/models/confirmed/")
    page.locator("ul.messages li.success", has_text="Saved confirmed.").wait_for()
    page.reload()  # shown once
    assert page.locator("ul.messages").count() == 0

    page.goto(page.url + "delete/")
    page.click("button[type=submit]:text('Delete')")
    page.wait_for_url("**/catalog/")
    page.locator("ul.messages li.success", has_text="Deleted confirmed").wait_for()


def test_every_page_has_a_favicon(open_page: Any, viewer: Any, live_server: Any) -> None:
    page = open_page(viewer, "/cluster/")
    missing: list[str] = []
    page.on("response", lambda r: missing.append(r.url) if r.status == 404 else None)
    for path in ("/cluster/", "/catalog/", "/guard/"):
        page.goto(live_server.url + path)
        href = page.locator("link[rel=icon]").get_attribute("href")
        assert href and page.request.get(live_server.url + href).ok
    answer = page.request.get(live_server.url + "/favicon.ico")
    assert answer.ok and answer.headers["content-type"] in (
        "image/x-icon",
        "image/vnd.microsoft.icon",
    )
    assert answer.body()[:4] == b"\x00\x00\x01\x00"  # an ICO
    assert not missing


def _console_pages(live_server: Any) -> list[str]:
    """Every console page, with data in it: a node, models, a judge, an evaluation."""
    join_node("a-node-with-a-rather-long-name-7", [H100] * 4, labels={"llmgw.io/rack": "r7"})
    long_source = "org/" + "a-model-whose-repository-has-a-long-name" * 2
    store(
        gpu_model(
            "chat",
            description="A chat model. " * 20,
            source=long_source,
            scaling={
                "min": 1,
                "max": 2,
                "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2}],
            },
        )
    )
    guard_model("qwen3guard-0.6b", "qwen3guard")
    run = EvalRun.objects.create(
        started=timezone.now(), set_name="builtin", set_source="builtin", set_digest="0" * 64,
        texts=1, judges=["qwen3guard-0.6b"], actor_name="otto", surface="console",
        status="done", finished=timezone.now(),
    )  # fmt: skip
    EvalResult.objects.create(
        run=run, judge="qwen3guard-0.6b", position=0, text="hello " * 40, label="ordinary",
        verdict="safe", score=0.01, latency_ms=12,
    )  # fmt: skip
    JoinToken.issue("rack-7")
    return [
        "/cluster/",
        "/catalog/",
        "/catalog/new/",
        "/catalog/models/chat/",
        "/catalog/models/chat/edit/",
        "/catalog/models/chat/schedule/",
        "/catalog/models/chat/delete/",
        "/guard/",
        "/guard/judges/qwen3guard-0.6b/",
        "/guard/evals/",
        f"/guard/evals/{run.pk}/",
        "/tokens/",
    ]


# The element sticking out furthest, to say what to fix.
WIDEST = """() => {
  let worst = null, right = 0;
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.right > right) { right = r.right; worst = el; }
  }
  return worst ? `${worst.tagName.toLowerCase()}#${worst.id}.${worst.className} (${Math.round(right)} px)` : '';
}"""


def test_no_page_is_wider_than_a_phone(
    open_page: Any, admin_user: Any, live_server: Any, browser: Any
) -> None:
    pages = _console_pages(live_server)
    page = open_page(admin_user, "/cluster/", PHONE)
    wide = {}
    for path in pages:
        page.goto(live_server.url + path)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > PHONE["width"]:
            wide[path] = f"{width} px: {page.evaluate(WIDEST)}"
        sign_out = page.locator("button:text('Sign out')")
        box = sign_out.bounding_box() if sign_out.count() else None
        assert box and box["x"] + box["width"] <= PHONE["width"], path
    assert not wide, wide
    # Signed out: the sign-in page too.
    context = browser.new_context(viewport=PHONE)
    try:
        login = context.new_page()
        login.goto(live_server.url + "/login/")
        assert login.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    finally:
        context.close()


def test_an_admin_manages_tokens_in_the_console(
    open_page: Any, admin_user: Any, viewer: Any, operator: Any, client_for: Any, client: Any
) -> None:
    page = open_page(admin_user, "/tokens/")
    # An API token: issued, its secret shown once, listed by prefix only.
    page.select_option("#id_api-user", admin_user.username)
    page.fill("#id_api-name", "ci-deploy")
    page.click("button:text('Issue API token')")
    secret = page.locator("#token-issued [data-role=secret]").inner_text().strip()
    token = ApiToken.objects.get(name="ci-deploy")
    assert secret.startswith("llmgw_") and token.prefix in secret
    page.goto(page.url.replace("/tokens/api/", "/tokens/"))
    assert secret not in page.content() and token.prefix in page.content()
    # It works, then is revoked and does not.
    assert (
        client.get(
            "/api/v1/catalog/models/", headers={"authorization": f"Bearer {secret}"}
        ).status_code
        == 200
    )
    page.locator(f"tr[data-token=api-{token.pk}] button:text('Revoke')").click()
    page.locator("ul.messages li.success", has_text="Revoked API token ci-deploy").wait_for()
    assert (
        page.locator(f"tr[data-token=api-{token.pk}] [data-role=state]").inner_text() == "revoked"
    )
    assert client.get(
        "/api/v1/catalog/models/", headers={"authorization": f"Bearer {secret}"}
    ).status_code in (401, 403)

    # A join token, with a limit; a bad value is refused at its field, nothing made.
    page.fill("#id_join-name", "rack-7")
    page.fill("#id_join-max_uses", "0")
    page.click("button:text('Issue join token')")
    page.locator("#err-join-max_uses", has_text="greater than or equal to 1").wait_for()
    assert not JoinToken.objects.exists()
    page.fill("#id_join-max_uses", "3")
    page.click("button:text('Issue join token')")
    join_secret = page.locator("#token-issued [data-role=secret]").inner_text().strip()
    join = JoinToken.objects.get(name="rack-7")
    assert join_secret.startswith("llmgw_join_") and join.max_uses == 3
    page.locator(f"tr[data-token=join-{join.pk}] button:text('Revoke')").click()
    page.locator("ul.messages li.success", has_text="Revoked join token rack-7").wait_for()
    join.refresh_from_db()
    assert join.revoked is not None and join.problem() == "this join token is revoked"

    # Each change is logged with who made it; no secret is.
    logged = list(ClusterAction.objects.filter(actor=admin_user).values_list("action", "detail"))
    assert [a for a, _ in logged] == [
        "join token revoked", "join token issued", "api token revoked", "api token issued",
    ]  # fmt: skip
    assert not any(secret in d or join_secret in d for _, d in logged)

    # Viewers and operators see no link and no button, and are refused.
    for user in (viewer, operator):
        c = client_for(user)
        assert "/tokens/" not in c.get("/catalog/").content.decode()
        assert c.get("/tokens/").status_code == 403
        assert c.post("/tokens/join/", {"join-name": "sneaky"}).status_code == 403
        assert c.post(f"/tokens/api/{token.pk}/revoke/").status_code == 403
    assert not JoinToken.objects.filter(name="sneaky").exists()
    assert Node.objects.count() == 0
