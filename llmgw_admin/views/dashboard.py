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
    """The cluster as it is: its counts and what needs attention first, a page of its
    nodes and of its models' replicas (``?nodes_page=``, ``?models_page=``), power,
    unplaced replicas, judges, federated peers; kept live.

    A fixed number of queries whatever the site's size: a large site's every block took
    seconds to render (2,000 models and 1,000 nodes), so the lists are paged, those
    needing attention first.
    """
    pages = cluster_live.Pages.of(request.GET)
    node_facts = cluster_live.node_facts()
    model_facts = cluster_live.model_facts()
    nodes = cluster_live.nodes_page(pages.nodes, node_facts)
    models = cluster_live.models_page(pages.models, model_facts)
    can_act = has_role(request.user, OPERATOR)
    context = {
        "pages": pages,
        "summary": cluster_live.summary(node_facts, model_facts),
        "nodes": nodes.rows,
        "nodes_listing": nodes.listing,
        "power": cluster_live.power_rows(),
        "models": models.rows,
        "models_listing": models.listing,
        **cluster_live.unplaced_context(),
        **guard_live.dashboard_judges_context(),  # the judges, and a warning when none answers
        **gateway_live.peers_context(can_act),  # the federated peers
        "can_act": can_act,
        "enable_judge": mark_safe(_enable_judge_form(request, cluster_live.any_simulated()))
        if can_act
        else "",  # noqa: S308
    }
    return render(request, "cluster/dashboard.html", context)
