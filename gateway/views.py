"""The console's client keys page: every key with its state, owner, models, limits,
expiry, prefix and usage (last used, requests and tokens today); operators create one (its secret shown once, on the answer) and
revoke one (confirmed first); viewers read. Everything goes through
``gateway.services`` (via ``gateway.keys``), logged with who did it, "console".

Also the chat page, the live traffic page and, from it, the guard's refusal records:
newest first, filtered by request id, key, model and direction, paginated."""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.db.models import F, OuterRef, QuerySet, Subquery, Sum
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from catalog.models import Adapter, ServedModel
from cluster.models import Replica
from cluster.placement import unplaceable
from cluster.services import no_room
from cluster.views.pages import wake_room
from gateway import cacheshare, keys, live, peers, services
from gateway.batch import routes, store
from gateway.batch import status as batch_status
from gateway.filtersets import RefusalFilterSet
from gateway.live import render_traffic
from gateway.models import PRIORITIES, ClientKey, Refusal, TrafficPoint, Usage
from gateway.records import history
from gateway.session import PATH
from llmgw_core.roles import OPERATOR, VIEWER, has_role, role_required

VIA = "console"


class KeyForm(forms.Form):
    name = forms.CharField(max_length=100, help_text="What uses it, e.g. support-bot.")
    owner = forms.CharField(
        max_length=120, required=False,
        help_text="org:NAME, team:NAME or project:NAME: whose traffic this is; peer:NAME: a "
        "federated cluster's key (never offered residency: local models).",
    )  # fmt: skip
    models = forms.CharField(
        required=False, max_length=10_000,
        help_text="Models, aliases or adapters it may name, separated by spaces or commas. "
        "Empty: every model in the cluster (external models only when listed).",
    )  # fmt: skip
    priority = forms.ChoiceField(
        choices=PRIORITIES, initial="normal", required=False,
        help_text="Its band while a model is past its latency SLO: high is always admitted, "
        "normal and low are held back first.",
    )  # fmt: skip
    rpm = forms.IntegerField(
        label="Requests per minute", min_value=0, max_value=services.MAX_LIMIT, initial=0,
        required=False, help_text="0: no limit.",
    )  # fmt: skip
    tpm = forms.IntegerField(
        label="Tokens per minute", min_value=0, max_value=services.MAX_LIMIT, initial=0,
        required=False, help_text="0: no limit.",
    )  # fmt: skip
    expires = forms.DateTimeField(
        required=False, help_text="Empty: never.",
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )  # fmt: skip


def today_start() -> datetime:
    """Return the start of today in the console's time zone (TIME_ZONE)."""
    return timezone.localtime().replace(hour=0, minute=0, second=0, microsecond=0)


def with_usage(keys_: QuerySet[ClientKey]) -> QuerySet[ClientKey]:
    """Annotate each key with its usage (gateway.records.usage's minutes, by the key's name):
    ``last_used`` (the last minute it was used in), ``requests_today`` and
    ``tokens_today`` (in and out), ``tokens_in_today`` and ``cached_today`` (of those in,
    read from the engine's prefix cache) since the start of today. One query, each key's figures
    read through the usage index on (key, minute)."""
    mine = Usage.objects.filter(key=OuterRef("name"))
    today = mine.filter(minute__gte=today_start()).order_by().values("key")
    return keys_.annotate(
        last_used=Subquery(mine.order_by("-minute").values("minute")[:1]),
        requests_today=Subquery(today.annotate(n=Sum("requests")).values("n")[:1]),
        tokens_today=Subquery(
            today.annotate(n=Sum(F("tokens_in") + F("tokens_out"))).values("n")[:1]
        ),
        tokens_in_today=Subquery(today.annotate(n=Sum("tokens_in")).values("n")[:1]),
        cached_today=Subquery(today.annotate(n=Sum("tokens_cached")).values("n")[:1]),
    )


def _page(
    request: HttpRequest,
    *,
    form: KeyForm | None = None,
    created: dict[str, Any] | None = None,
    status: int = 200,
) -> HttpResponse:
    listed = list(
        with_usage(ClientKey.objects.select_related("created_by").order_by("name", "-created"))[
            :500
        ]
    )
    for k in listed:
        k.cache_share = cacheshare.share(k.tokens_in_today, k.cached_today)
    context = {
        "keys": listed,
        "form": form or KeyForm(),
        "created": created,
    }
    return render(request, "gateway/keys.html", context, status=status)


@role_required(VIEWER)
@require_GET
def key_list(request: HttpRequest) -> HttpResponse:
    return _page(request)


@role_required(OPERATOR)
@require_http_methods(["POST"])
def key_create(request: HttpRequest) -> HttpResponse:
    """Make a key; the answer is the page with its secret, the one time it is shown."""
    form = KeyForm(request.POST)
    if not form.is_valid():
        return _page(request, form=form, status=400)
    data = form.cleaned_data
    try:
        key, secret = services.create_key(
            data["name"], owner=data["owner"], models=keys.split_models(data["models"]),
            expires=data["expires"], rpm=data["rpm"] or 0, tpm=data["tpm"] or 0,
            priority=data["priority"] or "normal", user=request.user, via=VIA,
        )  # fmt: skip
    except services.KeyRefused as error:
        for field, msgs in error.by_field().items():
            for message in msgs:
                form.add_error(field if field in form.fields else None, message)
        return _page(request, form=form, status=400)
    response = _page(request, created={"name": key.name, "secret": secret})
    response["Cache-Control"] = "no-store"  # the secret is in it
    return response


@role_required(OPERATOR)
@require_GET
def key_revoke_confirm(request: HttpRequest, pk: int) -> HttpResponse:
    key = get_object_or_404(ClientKey, pk=pk)
    return render(request, "gateway/key_revoke.html", {"key": key})


@role_required(OPERATOR)
@require_POST
def key_revoke(request: HttpRequest, pk: int) -> HttpResponse:
    """Revoke a key: every gateway process refuses it within a second; the row stays."""
    key = get_object_or_404(ClientKey, pk=pk)
    if keys.revoke(key, user=request.user, via=VIA):
        messages.success(request, f"Revoked client key {key.name}.")
    else:
        messages.info(request, f"Client key {key.name} was already revoked.")
    return redirect("gateway:key_list")


@role_required(VIEWER)
@require_GET
def chat(request: HttpRequest) -> HttpResponse:
    """Chat with any cluster model (never a judge, never an external one) through the
    gateway and its guard, as the signed-in user (``gateway.session``)."""
    rows = list(
        ServedModel.objects.exclude(role="guard")
        .filter(external_url="")
        .order_by("name")
        .values_list("name", "scaling_min", "scaling_max")
    )
    models = [name for name, _, _ in rows]
    wanted = Replica.objects.filter(desired=True, model_name__in=models)
    ready = set(wanted.filter(state="ready").values_list("model_name", flat=True))
    placed = set(wanted.filter(assignments__isnull=False).values_list("model_name", flat=True))
    rooms = no_room(models)
    # An asleep model a message would wake: tried on the cluster as it is now, so one a
    # send would get "no room" for is not offered as "started when asked".
    woken = wake_room([name for name, _, hi in rows if hi > 0 and name not in rooms])
    rooms.update(woken)
    roomless = set(rooms)
    never = {name for name, why in rooms.items() if unplaceable(why)}
    # What a message to each would meet: an answer, a start, or no room (as the gateway
    # answers it); adapters by their own names, as a client names them.
    options = [
        (name, name, _chat_note(name, lo, hi, ready, placed, roomless, never))
        for name, lo, hi in rows
    ]
    by_name = {name: (lo, hi) for name, lo, hi in rows}
    for adapter, base in (
        Adapter.objects.filter(model__name__in=models).exclude(name="")
        .order_by("name").values_list("name", "model__name")
    ):  # fmt: skip
        note = _chat_note(base, *by_name[base], ready, placed, roomless, never)
        options.append((adapter, f"{adapter} (adapter of {base})", note))
    replicas = {}
    for r in Replica.objects.filter(desired=True, model_name__in=models).prefetch_related(
        "assignments__node"
    ):
        nodes = ", ".join(sorted({a.node.name for a in r.assignments.all()}))
        replicas[str(r.pk)] = f"{r.model_name}/{r.profile} #{r.pk}" + (
            f" on {nodes}" if nodes else ""
        )
    context = {
        "models": options,
        "replicas_json": json.dumps(replicas),
        "chat_path": PATH,
        # ?model=NAME (a model page's "Try in Chat") chooses it.
        "chosen": request.GET.get("model", ""),
    }
    return render(request, "gateway/chat.html", context)


def _chat_note(
    name: str,
    lo: int,
    hi: int,
    ready: set[str],
    placed: set[str],
    roomless: set[str],
    never: set[str] | None = None,
) -> str:
    if name in ready:
        return ""
    if never and name in never:
        return "no node in this cluster can run it"
    if name in roomless:
        return "no room in the cluster now"
    if name in placed:
        return "starting"
    if hi == 0:
        return "not running (scaling.max 0)"
    return "started when asked" if lo == 0 else "waiting to be placed"


@role_required(VIEWER)
@require_GET
def traffic(request: HttpRequest) -> HttpResponse:
    """Each model's live traffic, pushed once a second (``gateway.live``)."""
    recorded = sorted(set(TrafficPoint.objects.values_list("model", flat=True)[:1000]))
    context = {"panel": mark_safe(render_traffic()), "recorded": recorded}
    model = request.GET.get("model")
    if model:
        context["history"] = history_context(request, model=model)
    return render(request, "gateway/traffic.html", context)


def history_context(request: HttpRequest, **which: str) -> dict[str, Any]:
    """The history partial's context for a model, a key or an owner (``gateway.records.history``)."""
    span = request.GET.get("span", "day")
    if span not in history.SPANS:
        span = "day"
    ((field, name),) = which.items()
    keep = {k: v for k, v in request.GET.items() if k not in ("span",)}
    return {
        "charts": history.charts_for(span=span, **which), "span": span,
        "spans": list(history.SPANS), "what": f"{field} {name}",
        "what_id": f"{field}-{name}".replace(":", "-"),
        "query": urlencode(keep) + "&" if keep else "",
    }  # fmt: skip


@role_required(VIEWER)
@require_GET
def history_page(request: HttpRequest) -> HttpResponse:
    """A model's, a key's or an owner's traffic over time (``?model=``, ``?key=``,
    ``?owner=``; ``span`` hour, day, week)."""
    which = {f: request.GET[f] for f in ("model", "key", "owner") if request.GET.get(f)}
    if len(which) != 1:
        return render(request, "gateway/history.html",
                      {"error": "Name one of model, key or owner."}, status=400)  # fmt: skip
    context = history_context(request, **which)
    if request.htmx:  # embedded in a model's or an owner's page: the charts alone
        return render(request, "gateway/partials/history_charts.html",
                      {**context, "embedded": True})  # fmt: skip
    return render(request, "gateway/history.html", context)


@role_required(VIEWER)
@require_GET
def cache_share(request: HttpRequest) -> HttpResponse:
    """A key's, an owner's or a model's cache-hit share today, per model (``?key=``,
    ``?owner=``, ``?model=``): embedded in the owner's page, or a page of its own."""
    which = {f: request.GET[f] for f in cacheshare.WHICH if request.GET.get(f)}
    if len(which) != 1:
        return render(request, "gateway/cache_share.html",
                      {"error": "Name one of key, owner or model."}, status=400)  # fmt: skip
    ((field, name),) = which.items()
    context = {"rows": cacheshare.per_model(today_start(), **which), "field": field,
               "name": name, "embedded": bool(request.htmx)}  # fmt: skip
    if request.htmx:
        return render(request, "gateway/partials/cache_share.html", context)
    return render(request, "gateway/cache_share.html", context)


# Refusal records on one page of the console's list.
REFUSALS_PER_PAGE = 50
FILTERS = ("request_id", "key", "model", "direction")


@role_required(VIEWER)
@require_GET
def refusal_list(request: HttpRequest) -> HttpResponse:
    """The guard's refusals on the gateway, newest first: an operator finds the request id
    a client was given (``x-request-id``), or a key's or a model's refusals.

    A filter or page that cannot be read is answered 400, saying which and why, with no
    rows.
    """
    values = {name: request.GET.get(name, "").strip() for name in FILTERS}
    filterset = RefusalFilterSet(
        {k: v for k, v in values.items() if v}, queryset=Refusal.objects.order_by("-at", "-pk")
    )
    errors: dict[str, list[str]] = {}
    if not filterset.is_valid():
        errors = {field: list(msgs) for field, msgs in filterset.errors.items()}
    raw_page = request.GET.get("page", "1").strip() or "1"
    number = int(raw_page) if re.fullmatch(r"[0-9]{1,9}", raw_page) else 0
    if number < 1:
        errors["page"] = [f"{raw_page[:20]!r} is no page number: write a whole number, 1 or more"]
    page = None
    if not errors:
        paginator = Paginator(filterset.qs, REFUSALS_PER_PAGE)
        page = paginator.get_page(number)  # past the last page: the last page
    context = {
        "values": values,
        "errors": errors,
        "page": page,
        "filtered": any(values.values()),
        "directions": Refusal.Direction.choices,
        "query": urlencode({k: v for k, v in values.items() if v}),
        "days": settings.LLMGW_GATEWAY_REFUSAL_DAYS,
    }
    return render(request, "gateway/refusal_list.html", context, status=400 if errors else 200)


@role_required(VIEWER)
@require_GET
def chat_state(request: HttpRequest) -> HttpResponse:
    """What a chat message to a model waits for: its wanted replicas as they are now.

    ``static/gateway/chat.js`` asks for this about once a second while a send is held
    (a model woken from zero, a replica starting or loading) until the first token, and
    says it under the conversation. ``?model=`` is a model's or an adapter's name.
    """
    name = request.GET.get("model", "")
    base = Adapter.objects.filter(name=name).values_list("model__name", flat=True).first() or name
    replicas = [
        {
            "id": r.pk,
            "state": r.state,
            "progress": None if r.progress is None else round(r.progress * 100),
            "reason": r.reason,
            "nodes": sorted({a.node.name for a in r.assignments.all()}),
        }
        for r in Replica.objects.filter(desired=True, model_name=base)
        .prefetch_related("assignments__node")
        .order_by("pk")
    ]
    return JsonResponse({"model": base, "replicas": replicas})


# How often an open Batches page asks for its table again: while a batch runs, and not.
BATCHES_FAST_S = 2
BATCHES_SLOW_S = 15
# The most batches the page lists (newest first).
BATCHES_SHOWN = 200


def _batches_context(notice: str = "") -> dict[str, Any]:
    now = time.time()
    found = store.list_batches(None)
    rows = [{"batch": b, "created": datetime.fromtimestamp(b["created_at"], tz=UTC),
             **batch_status.progress(b, now)} for b in found[:BATCHES_SHOWN]]  # fmt: skip
    running = any(not r["ended"] for r in rows)
    return {"rows": rows, "running": running, "more": max(0, len(found) - BATCHES_SHOWN),
            "refresh_s": BATCHES_FAST_S if running else BATCHES_SLOW_S,
            "keep": settings.LLMGW_FILES_KEEP, "notice": notice}  # fmt: skip


@role_required(VIEWER)
@require_GET
def batch_list(request: HttpRequest) -> HttpResponse:
    """Every owner's batches (the Batch API's), newest first: progress, lines a second,
    errors by kind; an operator may cancel one (what finished is kept). The table is a
    region the page asks for again every few seconds (``?region=1``): batches live on
    disk (``gateway.batch.store``), not on the live view's events."""
    context = _batches_context()
    if getattr(request, "htmx", False) and request.GET.get("region") == "1":
        return render(request, "gateway/batches.html#region", context)
    return render(request, "gateway/batches.html", context)


@role_required(OPERATOR)
@require_POST
def batch_cancel(request: HttpRequest, batch_id: str) -> HttpResponse:
    """Cancel a batch: the runner stops sending its lines; what finished is kept. Answers
    the page's table (htmx) or goes back to the page."""
    batch = routes.cancel(None, batch_id)
    if batch is None:
        said, level = f"No batch {batch_id}.", messages.ERROR
    elif batch["status"] in ("cancelling", "cancelled"):
        said = f"Batch {batch_id} is {batch['status']}: what finished is kept."
        level = messages.SUCCESS
    else:
        said = f"Batch {batch_id} is {batch['status']}: it cannot be cancelled."
        level = messages.INFO
    if getattr(request, "htmx", False):
        return render(request, "gateway/batches.html#region", _batches_context(said))
    messages.add_message(request, level, said)
    return redirect("gateway:batch_list")


class PeerForm(forms.Form):
    """A federated peer to add (``gateway.peers.add_peer`` checks it)."""

    name = forms.CharField(max_length=63, help_text="lowercase letters, digits and '-': its "
                           "models are NAME/MODEL")  # fmt: skip
    url = forms.CharField(max_length=500, help_text="the peer's address, https://…")
    key_file = forms.CharField(max_length=500, help_text="a file in LLMGW_SECRETS_DIR holding "
                               "a client key of the peer's")  # fmt: skip


def _peers_page(
    request: HttpRequest, form: PeerForm | None = None, status: int = 200
) -> HttpResponse:
    # The peers' panel is the fragment the live view pushes (gateway.live).
    panel = mark_safe(live.render_peers(has_role(request.user, OPERATOR)))  # noqa: S308
    context = {"panel": panel, "form": form or PeerForm()}
    return render(request, "gateway/peers.html", context, status=status)


@role_required(VIEWER)
@require_GET
def peer_list(request: HttpRequest) -> HttpResponse:
    """Federated peers: their state, last error and models (docs/federation.md)."""
    return _peers_page(request)


@role_required(OPERATOR)
@require_POST
def peer_add(request: HttpRequest) -> HttpResponse:
    form = PeerForm(request.POST)
    if not form.is_valid():
        return _peers_page(request, form=form, status=400)
    data = form.cleaned_data
    try:
        peers.add_peer(data["name"], data["url"], data["key_file"], user=request.user, via=VIA)
    except peers.PeerRefused as error:
        for field, msgs in error.errors.items():
            for message in msgs:
                form.add_error(field if field in form.fields else None, message)
        return _peers_page(request, form=form, status=400)
    messages.success(
        request, f"Added peer {data['name']}: its models appear within the next refresh."
    )
    return redirect("gateway:peer_list")


@role_required(OPERATOR)
@require_POST
def peer_remove(request: HttpRequest, peer: str) -> HttpResponse:
    """Remove a peer and its models (a peer's name, never a model's: lowercase, no /)."""
    name = peer
    try:
        removed = peers.remove_peer(name, user=request.user, via=VIA)
    except peers.PeerRefused as error:
        messages.error(request, str(error))
    else:
        messages.success(request, f"Removed peer {name} and {len(removed)} models.")
    return redirect("gateway:peer_list")
