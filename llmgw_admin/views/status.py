"""The console's view of the reconciler's last tick, polled by the dashboard.

A stopped worker or beat pushes nothing, so the dashboard asks every few seconds; the
fragment is ``templates/cluster/partials/reconciler.html``.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from cluster import marks
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import VIEWER, role_required


@role_required(VIEWER)
@require_GET
def reconciler(request: HtmxHttpRequest) -> HttpResponse:
    """The reconciler's last tick: its age, who ran it, a warning when it is old."""
    return render(request, "cluster/partials/reconciler.html", {"tick": marks.tick_status()})
