"""The console's home: the live dashboard of the cluster, its judges and its peers.

It shows every app (the cluster's nodes, power and models; the guard's judges and its
"enable a judge" form; the gateway's federated peers), so it lives on top, with the live
consumer that keeps it current (``llmgw_admin.consumer``); the page renders the same
fragments the consumer pushes, from each app's renderers (``cluster.live``,
``guard.live``, ``gateway.live``). Served at ``/cluster/``, named ``cluster:dashboard``
beside the cluster's actions (``llmgw_admin.urls``).
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET

from cluster import live as cluster_live
from gateway import live as gateway_live
from guard import live as guard_live
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, VIEWER, has_role, role_required


def _enable_judge_form(request: HtmxHttpRequest, simulated: bool) -> str:
    """The guard's own "enable a known judge" fragment; it posts to the guard's view.

    On a simulated cluster the sim engine is offered first: its judges need no weights.
    """
    context = guard_live.enable_judge_context(can_edit=True, where="sim" if simulated else "cpu")
    return render_to_string("guard/partials/enable_judge.html", context, request=request)


@role_required(VIEWER)
@require_GET
def dashboard(request: HtmxHttpRequest) -> HttpResponse:
    """The cluster as it is: nodes, power, models' replicas, unplaced, judges, federated
    peers; kept live."""
    nodes = cluster_live.node_rows()
    models = cluster_live.model_rows()
    can_act = has_role(request.user, OPERATOR)
    context = {
        "nodes": nodes,
        "power": cluster_live.power_rows(),
        "models": models,
        "unplaced": [(m.name, r) for m in models for r in m.unplaced],
        **guard_live.judges_context(),  # the judges, and a warning when none answers
        **gateway_live.peers_context(can_act),  # the federated peers
        "can_act": can_act,
        "enable_judge": mark_safe(_enable_judge_form(request, any(n.simulated for n in nodes)))
        if can_act
        else "",  # noqa: S308
    }
    return render(request, "cluster/dashboard.html", context)
