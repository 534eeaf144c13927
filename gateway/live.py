"""The live traffic panel's fragment, built without a request (the page and the pushes).

``templates/gateway/partials/traffic.html``, root element id ``gateway-traffic``: each
model's figures over the last seconds (``gateway.traffic.Window.summary``) with its SLO
met or missed. The web process's ``WINDOW`` holds what its consoles heard from every
gateway process; ``render_traffic`` is the renderer the live consumer calls once a
second (shared by the process's consoles: one render a second).
"""

from __future__ import annotations

import time
from typing import Any

from django.template.loader import render_to_string

from catalog.models import ServedModel
from gateway.traffic import SPAN, Window, slo_verdict

WINDOW = Window()
_rendered: tuple[int, str] | None = None


def traffic_rows(summary: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    slos = {
        name: (ttft, tpot)
        for name, ttft, tpot in ServedModel.objects.filter(name__in=list(summary)).values_list(
            "name", "slo_ttft_p99", "slo_tpot_p99"
        )
    }
    rows = []
    for model, fig in summary.items():
        ttft_slo, tpot_slo = slos.get(model, (0, 0))
        rows.append({
            "model": model, **fig,
            "ttft_slo_ms": ttft_slo / 1e6 if ttft_slo else None,
            "tpot_slo_ms": tpot_slo / 1e6 if tpot_slo else None,
            "ttft_slo": slo_verdict(fig["ttft_p99_ms"], ttft_slo),
            "tpot_slo": slo_verdict(fig["tpot_p99_ms"], tpot_slo),
            "error_pct": 100 * fig["error_rate"], "refusal_pct": 100 * fig["refusal_rate"],
        })  # fmt: skip
    return rows


def render_traffic(now: float | None = None) -> str:
    """The panel as of now; the same string for every console within a second."""
    global _rendered
    now = time.time() if now is None else now
    second = int(now)
    if _rendered is not None and _rendered[0] == second:
        return _rendered[1]
    html = render_to_string(
        "gateway/partials/traffic.html",
        {"rows": traffic_rows(WINDOW.summary(now)), "span": SPAN},
    )
    _rendered = (second, html)
    return html
