"""Console pages of the mirror and the update check (H19mirror's part of ``updates``).

- a model's updates panel (``model_panel``): its fetch into the mirror with progress, its
  last update check ("update available", what changed), and for operators "Check for
  updates"; on the model's page, asked for again every few seconds while it is open
  (more often while a fetch runs);
- ``model_check``: check a model now (operators), logged like the API's check;
- ``model_fetch``: fetch a model's files into the mirror now (operators), offered while it
  was never fetched;
- the mirror's page (``mirror_page``): what it holds, for which models, how much, against
  its cap, and the fetches queued, running and failed.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, VIEWER, has_role, role_required
from updates import checking, mirror
from updates.models import ACTIVE, Fetch, FetchState

# Seconds between a panel's refreshes: while a fetch runs, and otherwise.
FAST_S = 2
SLOW_S = 15


def panel_context(request: Any, name: str) -> dict[str, Any]:
    """Return what a model's updates panel shows."""
    from catalog.services import stored_specs

    found = stored_specs(names=[name])
    if not found:
        raise Http404(f"model {name!r} is not in the catalog")
    m = found[0]
    fetch = mirror.latest_fetch(name)
    active = fetch is not None and fetch.state in ACTIVE
    return {
        "name": name,
        "m": m,
        "origin": m.origin,
        "fetch": fetch,
        "percent": (
            round(100 * fetch.fraction)
            if fetch is not None and fetch.fraction is not None
            else None
        ),
        "check": checking.last_checks([name]).get(name),
        "checking": name in checking.checking_now([name]),
        "checkable": checking.checkable(m),
        "mirrorable": mirror.registry.kind(str(m.source or "")) is not None,
        "not_mirrored": mirror.registry.mirrored(str(m.source or "")),
        "mirror_on": mirror.enabled(),
        "can_check": has_role(request.user, OPERATOR),
        "can_fetch": (
            has_role(request.user, OPERATOR)
            and mirror.enabled()
            and mirror.registry.kind(str(m.source or "")) is not None
            and not mirror.registry.mirrored(str(m.source or ""))
            and (m.origin is None or not m.origin.revision)
            and not active
        ),
        "refresh_s": FAST_S if active else SLOW_S,
    } | _flow_context(request, name)


def _flow_context(request: Any, name: str) -> dict[str, Any]:
    """The update flow's part of the panel (H19flow: updates.flowviews), refreshed fast
    while an update runs."""
    from updates import flowviews

    found = flowviews.panel_context(request, name)
    return found | ({"refresh_s": FAST_S} if found["update_active"] else {})


@role_required(VIEWER)
def model_panel(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Answer a model's updates panel (a fragment the model's page asks for)."""
    return render(request, "updates/partials/model_panel.html", panel_context(request, name))


@role_required(OPERATOR)
@require_POST
def model_check(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Check a model for updates now; answer its panel (htmx) or go back to its page."""
    who = f"{request.user.get_username()} (console)"
    [result] = checking.check_models([name], by=who)
    if result.state == "error" and "not in the catalog" in result.message:
        raise Http404(result.message)
    if request.htmx:
        return render(request, "updates/partials/model_panel.html", panel_context(request, name))
    level = messages.error if result.state == "error" else messages.success
    level(request, f"{name}: {result.state}: {result.message}")
    return redirect("catalog:servedmodel_detail", name)


@role_required(OPERATOR)
@require_POST
def model_fetch(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Fetch a model's files into the mirror now (one never fetched: its origin is written
    when the fetch is done); answer its panel (htmx) or go back to its page."""
    from catalog.choices import Surface

    who = f"{request.user.get_username()} (console)"
    said = ""
    try:
        f = mirror.request_fetch(name, by=who, surface=Surface.CONSOLE)
        said = f"{name}: fetch #{f.pk} {f.get_state_display()}"
    except mirror.MirrorError as exc:
        if "not in the catalog" in str(exc):
            raise Http404(str(exc)) from None
        said = str(exc)
        if not request.htmx:
            messages.error(request, said)
            return redirect("catalog:servedmodel_detail", name)
    if request.htmx:
        context = panel_context(request, name)
        if said and context["fetch"] is None:
            context["fetch_refused"] = said
        return render(request, "updates/partials/model_panel.html", context)
    messages.success(request, said)
    return redirect("catalog:servedmodel_detail", name)


# The mirror's disk is shown as nearly full from this share used.
DISK_WARN = 0.95


def _disk() -> dict[str, Any]:
    """The mirror's disk: free and total bytes, and whether it is (nearly) full; a fetch
    that filled it up said so, and what it deleted (``mirror._download_or_free``)."""
    import shutil
    from pathlib import Path

    where = mirror.root()
    while not where.exists() and where != where.parent:
        where = where.parent  # not made yet: the disk it will be on
    try:
        usage = shutil.disk_usage(Path(where))
    except OSError:
        return {"disk_total": 0}
    full = (
        Fetch.objects.filter(
            state=FetchState.FAILED, reason__startswith="the mirror's disk filled up"
        )
        .order_by("-finished")
        .first()
    )
    return {
        "disk_total": usage.total,
        "disk_free": usage.free,
        "disk_percent": round(100 * usage.used / usage.total) if usage.total else 0,
        "disk_full": usage.total and usage.used / usage.total >= DISK_WARN,
        "disk_filled": full,
    }


@role_required(VIEWER)
def mirror_page(request: HtmxHttpRequest) -> HttpResponse:
    """Show what the mirror holds, for whom, and how much; and its fetches."""
    held = mirror.holdings()
    used = sum(h.bytes for h in held)
    cap_gb = float(settings.LLMGW_MIRROR_MAX_GB or 0)
    context = {
        "held": held,
        "used": used,
        "cap": int(cap_gb * 1e9) if cap_gb else 0,
        "cap_gb": cap_gb,
        "used_percent": round(100 * used / (cap_gb * 1e9)) if cap_gb else None,
        "active": list(Fetch.objects.filter(state__in=ACTIVE).order_by("created")),
        "failed": list(Fetch.objects.filter(state=FetchState.FAILED).order_by("-finished")[:20]),
        "mirror_on": mirror.enabled(),
        "is_operator": has_role(request.user, OPERATOR),
        "mirror_dir": str(settings.LLMGW_MIRROR_DIR),
        "endpoint": str(settings.HF_ENDPOINT),
        "refresh_s": FAST_S,
    } | _disk()
    if request.htmx and request.GET.get("region"):
        return render(request, "updates/mirror.html#region", context)
    return render(request, "updates/mirror.html", context)
