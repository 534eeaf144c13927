# ruff: noqa: F811  (the control plane fixtures are imported from tests/e2e)
"""The live view does not freeze, and never says "live" while it is not kept current.

In Chromium against `manage.py serve` (uvicorn, the embedded in-memory channel layer): an
operator opens and leaves 60 live pages in quick succession (consoles whose snapshot's
send fails as the browser leaves), and a cordon through the API still reaches a page
left open within a second. And a page whose web process stops (SIGSTOP: the socket
stays open, the hub's heartbeats stop) says "stale" within seconds, then "live" again
once the heartbeats come back.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cluster.models import Node, NodeHealth
from llmgw_core.models import ApiToken
from tests.browser.conftest import wait_js
from tests.e2e.conftest import (  # noqa: F401
    Agent,
    ControlPlane,
    agents,
    chromium,
    console,
    control_plane,
    wait_for,
)

pytestmark = [pytest.mark.e2e]

# Stamps, in the page, the wall clock at which the node's card first says a state.
STAMP_STATE = """
([id, word]) => {
  window.__shown = null;
  const look = () => {
    const state = document.querySelector('#' + id + ' [data-role=node-state]');
    if (window.__shown === null && state && state.textContent.trim() === word) {
      window.__shown = Date.now();
    }
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true,
                                                     characterData: true});
}
"""

# Counts, in the page, the hub's heartbeats it hears.
COUNT_BEATS = """
() => {
  window.__beats = 0;
  document.body.addEventListener('htmx:wsBeforeMessage', (e) => {
    if (e.detail.message === '<!-- llmgw:beat -->') window.__beats += 1;
  });
}
"""

# Opens 60 live sockets and leaves each as it opens (its snapshot then being read) or
# 0 to 116 ms after opening it; answers once all are closed.
LEAVE_60 = """
async (url) => {
  const gone = [];
  for (let n = 0; n < 60; n++) {
    const ws = new WebSocket(url);
    gone.push(new Promise((done) => { ws.onclose = done; }));
    if (n % 2) {
      ws.onopen = () => ws.close();
    } else {
      setTimeout(() => ws.close(), (n % 30) * 4);
    }
    await new Promise((r) => setTimeout(r, 5));
  }
  await Promise.all(gone);
  return gone.length;
}
"""


def test_a_cordon_reaches_an_open_page_within_a_second_after_60_pages_came_and_went(
    console: Callable[..., Any], control_plane: ControlPlane,
    agents: Callable[..., Agent], operator: Any,
) -> None:  # fmt: skip
    agents("freeze-1", "--simulate", "1x nvidia-l4-24gb")
    node = wait_for(
        lambda: Node.objects.filter(name="freeze-1", health=NodeHealth.READY).first(), 60, "node"
    )
    page = console(operator)  # open, and live
    card = f"cluster-node-{node.pk}"
    page.locator(f"#{card}").wait_for()

    # 60 pages opened and left in quick succession: each a socket of the page's own kind,
    # left at a varied moment of its connect (as it opens, or a few milliseconds on), as a
    # tab closed while it loads leaves it.
    left = page.evaluate(
        LEAVE_60, control_plane.url.replace("http", "ws") + "/ws/live/nodes,models,judges/"
    )
    assert left == 60

    # Each change after them reaches the page within a second: the first, and those after
    # (a console that never became ready held back every event after the one it took).
    _, secret = ApiToken.issue(operator, "freeze")
    for action, shown in [("cordon", "cordoned"), ("uncordon", "ready"), ("cordon", "cordoned")]:
        page.evaluate(STAMP_STATE, [card, shown])
        sent = time.time() * 1000
        r = httpx.post(
            f"{control_plane.url}/api/v1/cluster/nodes/{node.name}/{action}/",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=30,
        )
        assert r.status_code == 200, r.text
        page.locator(f"#{card} [data-role=node-state]", has_text=shown).wait_for(timeout=10_000)
        reached = page.evaluate("window.__shown") - sent
        assert reached < 1000, f"the {action} reached the open page {reached:.0f} ms after"
    # And the page says it is live, as it is; the consoles that left are not counted
    # against the user's cap (20): one more opens, live.
    assert page.inner_text("[data-live-status]") == "live"
    assert console(operator).inner_text("[data-live-status]") == "live"


def test_the_badge_says_stale_when_the_heartbeats_stop_and_live_when_they_resume(
    console: Callable[..., Any],
    control_plane: ControlPlane,
    viewer: Any,
) -> None:
    page = console(viewer)
    badge = "[data-live-status]"
    # Heartbeats keep it live well past the 5 s a silent page is trusted: three heard
    # (about 6 s), nothing else pushed.
    page.evaluate(COUNT_BEATS)
    wait_js(page, "window.__beats >= 3", timeout=20, what="three heartbeats")
    assert page.inner_text(badge) == "live"
    assert control_plane.proc is not None
    os.kill(control_plane.proc.pid, signal.SIGSTOP)  # the socket stays open, nothing comes
    try:
        stopped = time.monotonic()
        wait_js(page, "document.querySelector('[data-live-status].stale')", timeout=15,
                what="the badge to say stale")  # fmt: skip
        assert page.inner_text(badge) == "stale"
        # Within its 5 s of silence and the second its check waits, on a loaded machine.
        assert time.monotonic() - stopped < 10
    finally:
        os.kill(control_plane.proc.pid, signal.SIGCONT)
    wait_js(page, "document.querySelector('[data-live-status].on')", timeout=15,
            what="the badge to say live again")  # fmt: skip
    assert page.inner_text(badge) == "live"
