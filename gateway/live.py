"""The gateway's live fragments, built without a request (the pages and the pushes).

The federated peers' panel: ``templates/gateway/partials/peers.html``, root element id
``gateway-peers`` (``PEERS_DOM_ID``), each peer's state (``gateway.path.federation``'s up or
tripped, and while tripped how many of its recovery probes it has passed), last error,
models and when it was last read; on the dashboard and the Federated peers page, pushed
whole when a peer changes (the ``peers`` event, marked by ``gateway.peers``; its renderer
``peers_changed``). Operators get each peer's Remove button (a boosted form: the CSRF
token is in ``hx-headers`` on ``<body>``, never in the fragment).

The live traffic panel:

``templates/gateway/partials/traffic.html``, root element id ``gateway-traffic``: each
model's figures over the last seconds (``gateway.records.traffic.Window.summary``) with its SLO
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
from cluster.models import Assignment
from gateway.models import Peer
from gateway.path import federation
from gateway.records.traffic import SPAN, Window, slo_verdict

PEERS_DOM_ID = "gateway-peers"

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


def peer_rows() -> list[dict[str, Any]]:
    """Every federated peer as the panel shows it (one query)."""
    probes = settings.LLMGW_FEDERATION_RECOVER_PROBES
    rows = []
    for p in Peer.objects.all():
        tripped = p.state == federation.TRIPPED
        rows.append({
            "name": p.name, "url": p.url, "state": p.state, "last_error": p.last_error,
            "models": [f"{p.name}/{m}" for m in p.listed or ()],
            "refreshed": p.refreshed,
            "tripped_at": dt.datetime.fromtimestamp(p.tripped_at, tz=dt.UTC)
            if tripped and p.tripped_at else None,
            "recovering": tripped and p.passes > 0, "passes": p.passes, "probes": probes,
        })  # fmt: skip
    return rows


def peers_context(can_act: bool) -> dict[str, Any]:
    """The peers' panel's context (``gateway/partials/peers.html``)."""
    return {"peers": peer_rows(), "peers_dom_id": PEERS_DOM_ID, "can_act": can_act}


def render_peers(can_act: bool) -> str:
    """The peers' panel as the pages render it."""
    return render_to_string("gateway/partials/peers.html", peers_context(can_act))


def peers_changed(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """The peers' panel under "all": a handful of peers, sent whole (one added or removed
    shows too)."""
    return {"all": render_peers(can_act)}
