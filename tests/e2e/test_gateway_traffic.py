"""The console's live traffic as an operator meets it: real Chromium on
``/gateway/traffic/`` of a real ``manage.py serve``, pushed over the live websocket, while
clients send through a separate ``manage.py gateway serve`` process only: its seconds
reach the web process (the embedded relay) and the panel shows the model's requests/s,
TTFT, tokens/s and its SLO, TTFT met and time per token missed."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from cluster.models import Node
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import H100, gateway_process, new_key, ready, sim_model

pytestmark = pytest.mark.e2e


def test_traffic_through_another_process_is_pushed_with_its_slo(
    control_plane: ControlPlane, agents: Callable[..., Agent], console: Callable[..., Any],
    viewer: Any, tmp_path: Path,
) -> None:  # fmt: skip
    agents("traffic-node", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    # TTFT p99 within 30 s: met; a token every microsecond: missed.
    store(sim_model("busy", slo={"ttft_p99": "30s", "tpot_p99": "1us"}))
    wait_for(ready("busy"), 90, "the model ready")
    key = new_key(control_plane, "traffic")

    page = console(viewer, "/gateway/traffic/")
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # A process that has not heard the gateways for a whole span does not say "no traffic"
    # yet; once it has, and none came, it does.
    first = page.locator("#gateway-traffic").inner_text()
    assert "Listening to the gateways" in first or "No traffic in the last" in first, first
    page.locator("#gateway-traffic").get_by_text("No traffic in the last").wait_for(timeout=20_000)
    with gateway_process(control_plane, tmp_path) as alone:
        api = openai.OpenAI(base_url=alone + "/v1", api_key=key, max_retries=0)
        row = page.locator('#gateway-traffic tr[data-traffic="busy"]')

        def shown() -> bool:
            for _ in api.chat.completions.create(
                model="busy", messages=[{"role": "user", "content": "/echo a b c d e f"}],
                stream=True, stream_options={"include_usage": True},
            ):  # fmt: skip
                pass
            return row.count() == 1

        wait_for(shown, 30, "the model's traffic pushed")
        wait_for(lambda: row.locator('[data-slo="tpot"]').count() == 1, 10, "the SLO shown")
        assert float(row.locator("[data-role=rps]").inner_text()) > 0
        assert float(row.locator("[data-role=tps]").inner_text()) > 0
        assert "ms" in row.locator("[data-role=ttft-p99]").inner_text()
        # The engine's TTFT beside the client's (which the SLO is held to).
        assert "ms" in row.locator("[data-role=engine-ttft-p50]").inner_text()
        assert "ms" in row.locator("[data-role=engine-ttft-p99]").inner_text()
        for width in (1280, 390):  # the panel as pushed, at a desktop's width and a phone's
            page.set_viewport_size({"width": width, "height": 900})
            row.locator("[data-role=engine-ttft]").scroll_into_view_if_needed()
            assert row.locator("[data-role=engine-ttft]").is_visible()
        assert errors == []
        assert row.locator('[data-slo="ttft"]').inner_text() == "TTFT met"
        assert row.locator('[data-slo="tpot"]').inner_text() == "TPOT missed"
        assert row.locator("[data-role=errors]").inner_text() == "0.0 %"
