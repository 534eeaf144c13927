# ruff: noqa: F811  (the control plane fixtures are imported from tests/e2e)
"""The dashboard and the Federated peers page show a peer's state live, in Chromium
against ``manage.py serve`` (its reconcile tick reads the peer): a peer answering is up;
stopped (its port refusing connections) it shows tripped with the error, without a reload;
started again it shows recovering as it passes its probes, then up. An operator removes it
from the page, and the dashboard loses it live."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import peers
from gateway.models import Peer
from tests.browser.conftest import wait_js
from tests.browser.test_walk_pages import OVERFLOW
from tests.e2e.conftest import ControlPlane, chromium, console  # noqa: F401
from tests.gateway.harness import KEY
from tests.gateway.peerserver import PeerServer

pytestmark = [pytest.mark.e2e]

# The peer's row's state and last error as the page shows them now.
ROW = """
(name) => {
  const row = document.querySelector('#gateway-peers [data-peer="' + name + '"]');
  return row && {state: row.dataset.state,
                 error: row.querySelector('[data-role=last-error]').textContent.trim()};
}
"""
# Marks the document (a reload would lose the mark) and notes each state word the
# peer's row shows, and whether it ever said it was recovering.
WATCH = """
(name) => {
  window.__kept = true;
  window.__seen = [];
  const look = () => {
    const row = document.querySelector('#gateway-peers [data-peer="' + name + '"]');
    if (!row) return;
    const state = row.dataset.state + (row.querySelector('[data-role=recovering]') ? '+' : '');
    if (window.__seen[window.__seen.length - 1] !== state) window.__seen.push(state);
  };
  look();
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
}
"""


@pytest.fixture
def east(tmp_path: Path, settings: Any) -> Iterator[PeerServer]:
    server = PeerServer(["chat"])
    folder = tmp_path / "secrets"
    folder.mkdir()
    (folder / "east").write_text(KEY + "\n")
    settings.LLMGW_SECRETS_DIR = str(folder)
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [server.host]
    yield server
    server.stop()


@pytest.fixture
def control_plane(
    transactional_db: Any, tmp_path: Path, east: PeerServer
) -> Iterator[ControlPlane]:
    """The web process reading its peers every second, tripping on one failed read,
    and bringing a peer back after two passed reads and at least two seconds."""
    cp = ControlPlane(tmp_path, extra={
        "LLMGW_SECRETS_DIR": str(tmp_path / "secrets"), "LLMGW_EXTERNAL_HTTP_HOSTS": east.host,
        "LLMGW_FEDERATION_REFRESH": "1", "LLMGW_FEDERATION_TIMEOUT": "2",
        "LLMGW_FEDERATION_TRIP_ERRORS": "1", "LLMGW_FEDERATION_RECOVER_PROBES": "2",
        "LLMGW_FEDERATION_DWELL": "2",
    })  # fmt: skip
    cp.start()
    yield cp
    cp.stop()


def test_the_dashboard_and_the_peers_page_show_a_peer_trip_and_come_back_live(
    console: Callable[..., Any], east: PeerServer, viewer: Any, operator: Any
) -> None:
    peers.add_peer("east", east.url, "east")
    pages = [console(viewer, "/cluster/"), console(viewer, "/gateway/peers/")]
    said: list[str] = []  # what the pages say in the console as the pushes arrive (none)
    for page in pages:
        page.on("console", lambda m: said.append(m.text) if m.type in ("error", "warning") else None)  # fmt: skip
        page.on("pageerror", lambda e: said.append(str(e)))
        row = wait_js(page, f"({ROW})('east')?.state === 'up' && ({ROW})('east')", timeout=30,
                      what="the peer shown up")  # fmt: skip
        assert row["error"] == "—"
        page.evaluate(WATCH, "east")

    east.stop()  # the peer goes down: its port refuses connections
    for page in pages:
        row = wait_js(page, f"({ROW})('east')?.state === 'tripped' && ({ROW})('east')",
                      timeout=20, what="the peer shown tripped")  # fmt: skip
        assert "not reached" in row["error"], row
        # Its error and all fit a phone's width (the table scrolls, nothing is cut).
        page.set_viewport_size({"width": 390, "height": 900})
        assert page.evaluate(OVERFLOW) == []
        page.set_viewport_size({"width": 1400, "height": 1000})

    east.start()  # back on the same port: two passed reads and the dwell bring it back
    for page in pages:
        wait_js(page, f"({ROW})('east')?.state === 'up'", timeout=30, what="the peer back up")
        seen = page.evaluate("window.__seen")
        assert seen[0] == "up" and "tripped" in seen and "tripped+" in seen, seen
        assert seen[-1] == "up", seen
        assert page.evaluate("window.__kept") is True  # no reload: pushed live
    assert said == []

    # An operator removes it from the page's panel (a boosted form: the CSRF token from
    # <body>'s hx-headers); the viewer's dashboard loses it live.
    page = console(operator, "/gateway/peers/")
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator('#gateway-peers [data-peer="east"] button', has_text="Remove").click()
    page.get_by_text("Removed peer east").wait_for()
    assert not Peer.objects.exists()
    wait_js(pages[0], "!document.querySelector('#gateway-peers [data-peer]')", timeout=10,
            what="the peer gone from the dashboard")  # fmt: skip
    assert "No federated peer" in pages[0].locator("#gateway-peers").inner_text()
