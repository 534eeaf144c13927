"""The live traffic panel's fragment, built without a request (the page and the pushes).

``templates/gateway/partials/traffic.html``, root element id ``gateway-traffic``: each
model's figures over the last seconds (``gateway.traffic.Window.summary``) with its SLO
met or missed, and the replicas a gateway process has ejected from routing
(``Window.ejected``), each with when it comes back. The web process's ``WINDOW`` holds
what its consoles heard from every gateway process; ``render_traffic`` is the renderer the live consumer calls once a
second (shared by the process's consoles: one render a second).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django.conf import settings
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
            "kept_pct": None if fig.get("kept_share") is None else 100 * fig["kept_share"],
        })  # fmt: skip
    return rows


def ejected_rows(ejected: list[dict[str, Any]], now: float) -> list[dict[str, Any]]:
    """The ejected replicas as the panel lists them: with their node's name (the leader's,
    when the replica is gone: none) and the seconds until they come back."""
    from cluster.models import Assignment

    nodes = dict(
        Assignment.objects.filter(replica_id__in=[e["replica"] for e in ejected], rank=0)
        .values_list("replica_id", "node__name")
    )  # fmt: skip
    return [
        {**e, "node": nodes.get(e["replica"], ""), "in_s": max(0, round(e["until"] - now)),
         "until_at": dt.datetime.fromtimestamp(e["until"], tz=dt.UTC).strftime("%H:%M:%S")}
        for e in ejected
    ]  # fmt: skip


def render_traffic(now: float | None = None) -> str:
    """The panel as of now; the same string for every console within a second."""
    global _rendered
    now = time.time() if now is None else now
    second = int(now)
    if _rendered is not None and _rendered[0] == second:
        return _rendered[1]
    html = render_to_string(
        "gateway/partials/traffic.html",
        {
            "rows": traffic_rows(WINDOW.summary(now)),
            "span": SPAN,
            # Heard for a whole span: an empty window is no traffic, not "not heard yet".
            "heard": WINDOW.heard_for(now) >= SPAN,
            "ejected": ejected_rows(WINDOW.ejected(now), now) if WINDOW.items else [],
            "max_percent": settings.LLMGW_GATEWAY_EJECT_MAX_PERCENT,
        },  # fmt: skip
    )
    _rendered = (second, html)
    return html
