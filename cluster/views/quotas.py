"""The console's quotas: every owner's quota with what its replicas
hold now, the form that sets one and the button that removes it (operators), and an
owner's page: its quota, its parents', its models and their replicas, a waiting one with
the quota it waits on. Writes go through ``cluster.tenancy`` (checked, logged)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from catalog.models import ServedModel
from cluster import quotas, tenancy
from cluster.models import Quota, Replica
from llmgw_core.roles import OPERATOR, VIEWER, role_required

VIA = "console"


class QuotaForm(forms.Form):
    owner = forms.CharField(max_length=120, help_text="org:ID, team:ID or project:ID.")
    parent = forms.CharField(
        max_length=120, required=False,
        help_text="The owner it counts in: a project's team, a team's org. Empty: none.",
    )  # fmt: skip
    cards = forms.CharField(
        required=False, max_length=2000,
        help_text="Cards per GPU class, CLASS=N separated by spaces or commas, e.g. "
        "nvidia-h100-80gb=4. A class not named is not limited.",
    )  # fmt: skip
    cpu_cores = forms.IntegerField(
        label="CPU cores", min_value=0, required=False,
        help_text="Cores for profiles with no GPU. Empty: not limited.",
    )  # fmt: skip
    tpm = forms.IntegerField(
        label="Tokens per minute", min_value=0, required=False,
        help_text="A token budget shared by every client key of this owner. Empty or 0: none.",
    )  # fmt: skip


def _owners() -> dict[str, str]:
    return dict(ServedModel.objects.values_list("name", "owner"))


def _rows() -> list[dict[str, Any]]:
    used = tenancy.usage(_owners())
    rows = []
    for q in Quota.objects.all():
        held = used.get(q.owner, {})
        limits = [(c, n, held.get(c, 0)) for c, n in sorted(q.cards.items())]
        if q.cpu_cores is not None:
            limits.append((quotas.CPU, q.cpu_cores, held.get(quotas.CPU, 0)))
        rows.append({"quota": q, "limits": limits,
                     "spent": any(u >= n for _, n, u in limits)})  # fmt: skip
    return rows


def _page(request: HttpRequest, form: QuotaForm | None = None, status: int = 200) -> HttpResponse:
    waiting = Replica.objects.filter(desired=True, reason__contains="quota of ")
    context = {"rows": _rows(), "form": form or QuotaForm(), "waiting": waiting.order_by("pk")}
    return render(request, "cluster/quotas.html", context, status=status)


@role_required(VIEWER)
@require_GET
def quota_list(request: HttpRequest) -> HttpResponse:
    return _page(request)


@role_required(OPERATOR)
@require_POST
def quota_set(request: HttpRequest) -> HttpResponse:
    form = QuotaForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    data = form.cleaned_data
    try:
        cards = tenancy.parse_cards(data["cards"].replace(",", " ").split())
    except ValueError as error:
        form.add_error("cards", str(error))
        return _page(request, form, status=400)
    try:
        q = tenancy.set_quota(data["owner"], parent=data["parent"], cards=cards,
                              cpu_cores=data["cpu_cores"], tpm=data["tpm"] or 0,
                              user=request.user, via=VIA)  # fmt: skip
    except tenancy.QuotaRefused as error:
        for field, msgs in error.errors.items():
            for message in msgs:
                form.add_error(field if field in form.fields else None, message)
        return _page(request, form, status=400)
    messages.success(request, f"Quota of {q.owner}: {tenancy.describe(q)}.")
    return redirect("cluster:quota_list")


@role_required(OPERATOR)
@require_POST
def quota_delete(request: HttpRequest, owner: str) -> HttpResponse:
    try:
        tenancy.delete_quota(owner, user=request.user, via=VIA)
    except tenancy.QuotaRefused as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Quota of {owner} removed.")
    return redirect("cluster:quota_list")


@role_required(VIEWER)
@require_GET
def owner_detail(request: HttpRequest, owner: str) -> HttpResponse:
    """An owner: its quota and its parents', its models (its children's too) and their
    replicas, each waiting one with its reason."""
    book = tenancy.book({}) or quotas.Book()
    chain = book.chain(owner) or [owner]
    used = tenancy.usage(_owners())
    chain_rows = []
    for o in chain:
        q = book.quotas.get(o)
        limits = []
        if q is not None:
            limits = [(c, n, used.get(o, {}).get(c, 0)) for c, n in sorted(q.cards.items())]
            if q.cpu_cores is not None:
                limits.append((quotas.CPU, q.cpu_cores, used.get(o, {}).get(quotas.CPU, 0)))
        chain_rows.append({"owner": o, "has_quota": q is not None, "limits": limits})
    # Its models: owned by it, or by an owner whose chain passes through it.
    names = [n for n, o in _owners().items() if o and owner in book.chain(o)]
    replicas = Replica.objects.filter(model_name__in=names, desired=True).order_by(
        "model_name", "pk"
    )
    context = {"owner": owner, "chain": chain_rows, "models": sorted(names),
               "replicas": replicas, "in_use": used.get(owner, {})}  # fmt: skip
    return render(request, "cluster/owner_detail.html", context)
