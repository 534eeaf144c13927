"""Every console page issues 16 to 20 touched, walked in a real Chromium at 1280 and
390 px, as an admin and as a viewer, with a cluster in it (a node, a model with a replica
and a failed one's log, a guard judge, a key, a team's quota): no console error, no CSP violation, and
nothing wider than the window (a page scrolling sideways has something cut off or
overlapping at 390). Screenshots of each go to ``LLMGW_WALK_SHOTS`` when it is set."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cluster import reconciler
from cluster.models import Assignment, Replica
from tests.catalog.samples import gpu_model, store
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db(transaction=True)

H100 = "nvidia-h100-80gb"
WIDTHS = {"1280": {"width": 1280, "height": 1000}, "390": {"width": 390, "height": 844}}
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sourceFile);
});
"""
# Elements reaching past the window's right edge with nothing scrolling them (cut off), and
# buttons squeezed into a column of letters.
OVERFLOW = """
() => {
  const w = document.documentElement.clientWidth;
  const out = [];
  for (const el of document.querySelectorAll('body *')) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;
    if (r.right > w + 1) {
      let scroller = el.parentElement;
      while (scroller && scroller !== document.body) {
        const s = getComputedStyle(scroller);
        if (/(auto|scroll)/.test(s.overflowX)) break;  // it scrolls: nothing is lost
        scroller = scroller.parentElement;
      }
      if (!scroller || scroller === document.body) {
        out.push(el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
                 (el.className && typeof el.className === 'string' ? '.' + el.className.split(' ')[0] : '') +
                 ' right=' + Math.round(r.right));
      }
    }
  }
  // A button squeezed narrower than its words (one letter a line).
  for (const el of document.querySelectorAll('button, a.button')) {
    const r = el.getBoundingClientRect();
    const size = parseFloat(getComputedStyle(el).fontSize);
    if (r.height > 3.2 * size) out.push('squeezed ' + el.textContent.trim() + ' h=' + Math.round(r.height));
  }
  return out.slice(0, 8);
}
"""


def cluster() -> dict[str, Any]:
    """A node holding a model's replica and a failed replica with its log; a judge; a key."""
    from gateway import services

    node, _ = join_node("gpu-walk-with-a-long-name-1", [H100, H100, H100], agent_version="0.9.1")
    from cluster import tenancy

    tenancy.set_quota("team:walk-team", cards={H100: 4}, via="test")
    store(
        gpu_model(
            "chat-model-with-a-rather-long-name",
            scaling={"min": 1, "max": 1},
            owner="team:walk-team",
        )
    )
    store(gpu_model("sleepy", scaling={"min": 0, "max": 1}))
    reconciler.tick()
    rid = Replica.objects.get(model_name="chat-model-with-a-rather-long-name").pk
    Assignment.objects.filter(replica_id=rid).update(
        state="failed",
        reason="exited with code 1: CUDA out of memory; restarting in 8 s",
        log=["--- generation 1: ['vllm', 'serve', '--model', '/weights/a/very/long/path/x']",
             "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.35 GiB total capacity)"],
    )  # fmt: skip
    services.create_key("walk-app", via="test")
    return {"node": node.pk, "replica": rid, "model": "chat-model-with-a-rather-long-name"}


def pages(ids: dict[str, Any], admin: bool) -> list[str]:
    m = ids["model"]
    out = [
        "/cluster/",
        f"/cluster/nodes/{ids['node']}/",
        "/catalog/",
        f"/catalog/models/{m}/",
        "/guard/",
        "/guard/evals/",
        "/gateway/keys/",
        "/gateway/chat/",
        "/gateway/traffic/",
        "/gateway/refusals/",
        f"/gateway/history/?model={m}",
        "/cluster/quotas/",
        "/cluster/owners/team:walk-team/",
        "/updates/",
        "/updates/mirror/",
    ]
    if admin:
        out += [
            f"/cluster/replicas/{ids['replica']}/log/",
            "/catalog/new/",
            f"/catalog/models/{m}/edit/",
            f"/catalog/models/{m}/schedule/",
            "/tokens/",
        ]
    return out


@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("role", ["admin", "viewer"])
def test_every_page_of_issues_16_to_20_fits_and_says_no_error(
    open_page: Any, make_user: Any, live_server: Any, role: str, width: str
) -> None:
    ids = cluster()
    user = make_user(f"walk-{role}", role)
    page = open_page(user, "/cluster/", WIDTHS[width])
    page.add_init_script(WATCH)
    shots = os.environ.get("LLMGW_WALK_SHOTS")
    found: dict[str, Any] = {}
    for path in pages(ids, role == "admin"):
        answer = page.goto(f"{live_server.url}{path}")
        assert answer is not None and answer.status == 200, (path, answer and answer.status)
        page.wait_for_load_state("networkidle")
        if shots:
            name = path.strip("/").replace("/", "_").replace("?", "_") or "home"
            page.screenshot(path=str(Path(shots) / f"{role}-{width}-{name}.png"), full_page=True)
        wide = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        cut = page.evaluate(OVERFLOW)
        csp = page.evaluate("window.__csp")
        if wide > 1 or cut or csp or page.errors:
            found[path] = {"wider by": wide, "past the edge": cut, "csp": csp,
                           "errors": list(page.errors)}  # fmt: skip
        page.errors.clear()
    assert found == {}, found
