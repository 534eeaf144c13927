"""The cluster's pages of one thing: a node's page and a replica's engine log.

The dashboard (``llmgw_admin.dashboard``) shows every node and model at once; these show
one node whole (its cards and the replica holding each, the replicas it runs, its agent)
and one replica's engine log as its agents last reported it (``cluster.nodepage``, which
the API reads too). Each page asks again for its region every few seconds while it is
open (htmx's ``every``): the log is not on the live view's events, which every open
dashboard hears, and a page of one node or replica is opened by a few operators at a time.
"""

from __future__ import annotations

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render

from cluster import nodepage
from cluster.models import Node, Replica
from llmgw_admin.htmx import HtmxHttpRequest
from llmgw_admin.roles import OPERATOR, VIEWER, has_role, role_required

# How often an open page asks for its region again.
NODE_REFRESH_S = 5
LOG_REFRESH_S = 3


@role_required(VIEWER)
def node_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A node: what it has, its cards and what holds them, the replicas it runs."""
    node = get_object_or_404(Node.objects.prefetch_related("cards"), pk=pk)
    operator = has_role(request.user, OPERATOR)
    context = {
        "node": node,
        "detail": nodepage.node_detail(node, operator),
        "can_act": operator,
        "refresh_s": NODE_REFRESH_S,
    }
    if request.htmx and request.GET.get("region") == "1":
        return render(request, "cluster/node_detail.html#region", context)
    return render(request, "cluster/node_detail.html", context)


@role_required(OPERATOR)
def replica_log(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """A replica's engine log: the last lines of its stdout and stderr on each node."""
    replica = get_object_or_404(Replica, pk=pk)
    context = {
        "replica": replica,
        "nodes": nodepage.replica_log(replica),
        "refresh_s": LOG_REFRESH_S,
    }
    if request.htmx and request.GET.get("region") == "1":
        return render(request, "cluster/replica_log.html#region", context)
    return render(request, "cluster/replica_log.html", context)
