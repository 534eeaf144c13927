"""The cluster's pages of one thing: a node's page and a replica's engine log; and the
model page's Scale and Wake buttons (operators), which act on the cluster.

The dashboard (``llmgw_admin.views.dashboard``) shows every node and model at once; these show
one node whole (its cards and the replica holding each, the replicas it runs, its agent)
and one replica's engine log as its agents last reported it (``cluster.details``, which
the API reads too). Each page asks again for its region every few seconds while it is
open (htmx's ``every``): the log is not on the live view's events, which every open
dashboard hears, and a page of one node or replica is opened by a few operators at a time.
"""

from __future__ import annotations

import dataclasses

from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from catalog import rules
from catalog import services as catalog_services
from catalog.choices import Surface
from catalog.models import ServedModel
from cluster import agentinput, details, placement, replace, services
from cluster.models import Node, Replica
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, VIEWER, has_role, role_required

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
        "detail": details.node_detail(node, operator),
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
        "nodes": details.replica_log(replica),
        "refresh_s": LOG_REFRESH_S,
    }
    if request.htmx and request.GET.get("region") == "1":
        return render(request, "cluster/replica_log.html#region", context)
    return render(request, "cluster/replica_log.html", context)


# The most replicas the Scale form takes (the rules take more; the form is for a person).
SCALE_MAX = 10_000


def _whole(raw: str, field: str) -> tuple[int | None, str]:
    raw = raw.strip()
    if not raw.isdigit() or len(raw) > 5 or int(raw) > SCALE_MAX:
        return None, f"{field} must be a whole number from 0 to {SCALE_MAX}, not {raw[:20]!r}"
    return int(raw), ""


@role_required(OPERATOR)
@require_POST
def model_scale(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Set a model's scaling.min and scaling.max through the catalog's one write path
    (checked, written, logged with who did it, as the edit form's save is)."""
    obj = ServedModel.objects.filter(name=name).first()
    if obj is None:
        raise Http404(f"model {name!r} is not in the catalog")
    low, low_error = _whole(request.POST.get("min", ""), "scaling.min")
    high, high_error = _whole(request.POST.get("max", ""), "scaling.max")
    if low is None or high is None:
        messages.error(request, f"Not scaled: {low_error or high_error}. Nothing changed.")
        return redirect("catalog:servedmodel_detail", name)
    m = obj.to_spec()
    new = dataclasses.replace(m, scaling=dataclasses.replace(m.scaling, min=low, max=high))
    actor = catalog_services.Actor(user=request.user, surface=Surface.CONSOLE)
    try:
        catalog_services.save_model(new, actor, replacing=name, note="scaled on its page")
    except catalog_services.Refused as exc:
        said = "; ".join(f"{p.field}: {p.message}" for p in exc.problems)
        messages.error(request, f"Not scaled: {said}. Nothing changed.")
        return redirect("catalog:servedmodel_detail", name)
    if (m.scaling.min, m.scaling.max) == (low, high):
        messages.info(request, f"{name} already scales from {low} to {high} replicas.")
    else:
        messages.success(
            request,
            f"Scaled {name}: min {m.scaling.min} → {low}, max {m.scaling.max} → {high}.",
        )
    return redirect("catalog:servedmodel_detail", name)


@role_required(OPERATOR)
@require_POST
def model_wake(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Record demand for a model, as the API's demand call does: an on-demand model
    scaled to zero is started now (logged with who did it)."""
    try:
        services.demand(name)
    except agentinput.AgentError as exc:
        raise Http404(str(exc)) from exc
    services.log_action(request.user, "wake", f"model {name}", "demand recorded", "console")
    messages.success(
        request,
        f"Asked for {name}: a replica starts if none runs; it stays up for its idle_timeout.",
    )
    return redirect("catalog:servedmodel_detail", name)


def wake_room(names: list[str]) -> dict[str, str]:
    """Return, for each named model that no replica is wanted for (asleep), why a wake
    would find no room now: placement tried with one replica of it on the cluster as it
    is, as the reconciler's tick would place it. A model a wake would start is left out.

    The Chat page (``gateway.views.chat``) says "started when asked" only of a model a
    message would start; one a send would get "no room" for says so before the send.
    """
    asleep = set(names) - set(
        Replica.objects.filter(desired=True, model_name__in=names).values_list(
            "model_name", flat=True
        )
    )
    if not asleep:
        return {}
    specs = {m.name: rules.normalize(m) for m in catalog_services.stored_specs()}
    snap = replace.snapshot(specs)
    found: dict[str, str] = {}
    for name in sorted(asleep):
        m = specs.get(name)
        if m is None or rules.is_external(m):
            continue
        request = placement.Request(
            f"{name}/wake",
            name,
            tuple(placement.profiles_from_spec(m)),
            rules.class_rank(rules.effective_class(m)),
        )
        trial = placement.place(snap.p_nodes, snap.domains, snap.running, [request])
        if trial.unplaced:
            found[name] = trial.unplaced[0].told
    return found
