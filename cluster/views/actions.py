"""The cluster's console: the operators' actions on the live dashboard.

The dashboard (``llmgw_admin.views.dashboard``) renders the same fragments
(``templates/cluster/partials/``, ``cluster.live``) that the live consumer pushes; each
action answers with its fragment, and every other open console gets it pushed. The actions are the API's (cluster.api.views): the same services,
logged the same way, through "console".
"""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404
from django.template.loader import render_to_string
from django.utils import timezone
from django.views.decorators.http import require_GET, require_POST

from cluster import agentinput, agentjoin, benchrun, live, services
from cluster.live import render_model, render_node
from cluster.models import Node, Replica
from cluster.replace import DrainRefused
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, VIEWER, role_required

NODE_ACTIONS = ("cordon", "uncordon", "drain", "release")


@role_required(VIEWER)
@require_GET
def heartbeats(request: HttpRequest) -> JsonResponse:
    """Every node's last heartbeat and the server's clock, for the pages' heartbeat ages.

    Heartbeats push nothing (only state changes do); ``static/llmgw/console.js`` asks for
    this every few seconds while a page shows a node, and counts each age from it with
    the server's clock (one query).
    """
    stamps = Node.objects.values_list("pk", "last_heartbeat")
    return JsonResponse(
        {
            "now": timezone.now().isoformat(),
            "nodes": {str(pk): at.isoformat() if at else None for pk, at in stamps},
        }
    )


@role_required(OPERATOR)
@require_POST
def node_action(request: HtmxHttpRequest, pk: int, action: str) -> HttpResponse:
    """Cordon, uncordon, drain or release a node; answer with the node's fragment."""
    if action not in NODE_ACTIONS:
        raise Http404(f"no node action {action!r}")
    node = get_object_or_404(Node, pk=pk)
    if action == "drain":
        try:
            done = services.drain(node, force=request.POST.get("force") == "1")
        except DrainRefused as exc:
            return _drain_refused(request, node, exc)
        services.log_action(request.user, "drain", f"node {node.name}", done.summary, "console")
    elif action == "release":
        agentjoin.release(node, request.user.get_username())
        services.log_action(
            request.user, "release", f"node {node.name}",
            "node token dropped; the next join takes it", "console",
        )  # fmt: skip
    else:
        services.set_cordon(node, action == "cordon")
        services.log_action(request.user, action, f"node {node.name}", "", "console")
    row = live.node_rows([node.pk])[0]
    # The node's drain message outlives pushes of its fragment (hx-preserve); the page
    # clears it as an action starts (static/llmgw/console.js). Not an out-of-band swap
    # here: the action's own push often replaces the card first, the button with it, and
    # htmx then finds no target for it (htmx:oobErrorNoTarget).
    return HttpResponse(render_node(row, can_act=True))


def _drain_refused(request: HtmxHttpRequest, node: Node, exc: DrainRefused) -> HttpResponse:
    """Say why a drain was refused, in the node's drain message, with "Drain anyway"."""
    blocks = " ".join(live.model_dom_id(name) for name in exc.models)
    html = render_to_string(
        "cluster/partials/drain_refused.html",
        {"node": node, "refusal": exc, "blocks": blocks},
        request=request,
    )
    response = HttpResponse(html)
    # The node's fragment stays as it is (nothing changed); only its message is filled.
    response["HX-Retarget"] = f"#cluster-node-{node.pk}-drain"
    response["HX-Reswap"] = "innerHTML"
    return response


@role_required(OPERATOR)
@require_POST
def replica_restart(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Restart a replica's engine; answer with its model's fragment."""
    replica = get_object_or_404(Replica, pk=pk)
    replica = services.restart_replica(replica)
    services.log_action(
        request.user,
        "restart",
        f"replica {pk} of {replica.model_name}",
        f"generation {replica.generation}",
        "console",
    )
    return HttpResponse(render_model(live.model_row(replica.model_name), True, replica.model_name))


@role_required(OPERATOR)
@require_POST
def model_bench(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Start the capacity bench on a ready replica of the model (the profile posted, or the
    first ready one's); answer with its fragment, which says it started or why not."""
    profile = (request.POST.get("profile") or "").strip() or None
    row = live.model_row(name)
    try:
        benchrun.ready_replica(name, profile)
    except benchrun.BenchError as exc:
        if row is not None:
            row.bench = f"bench not started: {exc}"
        return HttpResponse(render_model(row, True, name))
    benchrun.start(name, profile, request.user, "console", "console")
    row = live.model_row(name)
    return HttpResponse(render_model(row, True, name))


@role_required(OPERATOR)
@require_POST
def model_roll(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Roll a model's outdated replicas (new ready before old stops); answer with its fragment."""
    try:
        started = services.roll(name)
    except agentinput.AgentError as exc:
        raise Http404(str(exc)) from exc
    services.log_action(request.user, "roll", f"model {name}", f"replacements {started}", "console")
    return HttpResponse(render_model(live.model_row(name), True, name))
