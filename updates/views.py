"""The updates app's console pages.

The mirror and the update check:

- a model's updates panel (``model_panel``): its fetch into the mirror with progress, its
  last update check ("update available", what changed), and for operators "Check for
  updates"; on the model's page, asked for again every few seconds while it is open
  (more often while a fetch runs);
- ``model_check``: check a model now (operators), logged like the API's check;
- ``model_fetch``: fetch a model's files into the mirror now (operators), offered while it
  was never fetched;
- the mirror's page (``mirror_page``): what it holds, for which models, how much, against
  its cap, and the fetches queued, running and failed.

The update flow:

- the **Updates page** (``updates_page``, ``/updates/``): every model's update state:
  current, update available (the last check), fetching with progress, evaluating with
  the score so far, canary with its figures, ready to promote, promoted, failed with why;
  filtered by name and state; its table asked for again every two seconds while open;
- on a model's page, inside its weights-and-updates panel (``panel_context``): the last
  update's state and a progress line per step, and for operators **Update**, **Promote**
  and **Rollback** (``model_update``, ``model_promote``, ``model_rollback``), each
  recorded as made from the console by the signed-in user. Viewers see the states and no
  button.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST

from catalog import rules
from catalog.choices import Surface
from catalog.services import stored_specs
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, VIEWER, has_role, role_required
from updates import checking, flow, mirror, registry, run
from updates.models import ACTIVE, Fetch, FetchState, UpdateRun

# Seconds between a panel's refreshes: while a fetch runs, and otherwise.
FAST_S = 2
SLOW_S = 15


def panel_context(request: Any, name: str) -> dict[str, Any]:
    """Return what a model's updates panel shows."""
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
        "mirrorable": registry.kind(str(m.source or "")) is not None,
        "not_mirrored": registry.mirrored(str(m.source or "")),
        "mirror_on": mirror.enabled(),
        "can_check": has_role(request.user, OPERATOR),
        "can_fetch": (
            has_role(request.user, OPERATOR)
            and mirror.enabled()
            and registry.kind(str(m.source or "")) is not None
            and not registry.mirrored(str(m.source or ""))
            and (m.origin is None or not m.origin.revision)
            and not active
        ),
        "refresh_s": FAST_S if active else SLOW_S,
    } | _update_part(request, name, m)


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
    that filled it up said so, and what it deleted (``updates.mirror.download``)."""
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
    used = mirror.kept_bytes()  # each content once: revisions share their files
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


# -- the update flow ----------------------------------------------------------------------


# What the page's state filter offers, in the order a model goes through them.
STATES = (
    "unchecked", "current", "available", "checking", "fetching", "candidate", "evaluating",
    "canary", "ready", "promoted", "failed",
)  # fmt: skip
# Seconds between the table's own refreshes: the live view asks for it at once when a
# model changes (updates.views.region_poke); this is the net under it.
REFRESH_S = 10


@dataclass
class Row:
    """One model on the Updates page."""

    model: str
    state: str  # one of STATES
    line: str  # what it is doing, or why it failed
    run: UpdateRun | None = None
    percent: int | None = None  # a fetch's progress
    revision: str = ""


def state_of(r: UpdateRun | None, check_state: str = "", checking: bool = False) -> str:
    """Return a model's state on the Updates page from its last update and check, and
    whether a check of it runs now ("checking", unless an update of it runs)."""
    if r is not None and r.state == "running":
        return {
            flow.FETCH: "fetching",
            flow.CANDIDATE: "candidate",
            flow.EVAL: "evaluating",
            flow.CANARY: "canary",
            flow.PROMOTE: "ready",
        }[r.step]
    if r is not None and r.state == "waiting":
        return "ready"
    if checking:
        return "checking"
    if check_state == "available":
        return "available"
    if r is not None and r.state == "failed" and check_state != "current":
        return "failed"
    if r is not None and r.state == "promoted" and check_state != "available":
        return "promoted"
    if r is None and not check_state:
        return "unchecked"  # never checked nor updated: not known to be current
    return "current"


def line_of(r: UpdateRun | None) -> str:
    """Return what a model's update is doing: the step's line, the score so far, the
    canary's figures, or why it failed."""
    if r is None:
        return ""
    if r.state == "failed":
        return r.reason
    if r.state == "running" and r.step == flow.EVAL and r.eval_total:
        return flow.eval_progress(r.eval_passed, r.eval_done, r.eval_total)
    return r.lines[-1]["text"] if r.lines else ""


def rows(name: str = "", state: str = "") -> list[Row]:
    """Return every model's row (an update's candidate apart), filtered."""
    specs = [m for m in stored_specs() if not flow.is_candidate(m.name) and m.external is None]
    if name:
        specs = [m for m in specs if name.lower() in m.name.lower()]
    names = [m.name for m in specs]
    last: dict[str, UpdateRun] = {}
    for r in UpdateRun.objects.filter(model__in=names).order_by("model", "-created", "-id"):
        last.setdefault(r.model, r)
    checks = checking.last_checks(names)
    now_checking = checking.checking_now(names)
    fetches = {
        f.pk: f
        for f in Fetch.objects.filter(pk__in=[r.fetch_id for r in last.values() if r.fetch_id])
    }
    # The newest fetch of each model with no update nor check: the mirror's first fetch.
    first_fetches: dict[str, Fetch] = {}
    bare = [n for n in names if n not in last and n not in checks]
    for f in Fetch.objects.filter(model__in=bare).order_by("model", "-id"):
        first_fetches.setdefault(f.model, f)
    out = []
    for m in specs:
        r = last.get(m.name)
        check = checks.get(m.name)
        row = Row(m.name, state_of(r, check.state if check else "", m.name in now_checking),
                  line_of(r), r,
                  revision=m.origin.revision if m.origin is not None else "")  # fmt: skip
        if row.state == "checking":
            row.line = "asking the registry for its newest revision"
        elif row.state == "available" and check is not None and not row.line:
            row.line = check.message
        elif row.state == "available" and check is not None:
            row.line = f"{check.message} (last update: {row.line})"
        if row.state == "fetching" and r is not None:
            f = fetches.get(r.fetch_id or 0)
            if f is not None and f.fraction is not None:
                row.percent = round(100 * f.fraction)
        if row.state == "unchecked":
            _unchecked(row, m, first_fetches.get(m.name))
        out.append(row)
    return [row for row in out if not state or row.state == state]


def _unchecked(row: Row, m: Any, fetch: Fetch | None) -> None:
    """Say what a model never checked nor updated is waiting for: its first fetch into the
    mirror (under way, or failed with why), or nothing to mirror at all."""
    if fetch is not None and fetch.state in ACTIVE:
        row.state = "fetching"
        row.line = f"the mirror fetches its weights ({fetch.source})"
        if fetch.fraction is not None:
            row.percent = round(100 * fetch.fraction)
    elif fetch is not None and fetch.state == FetchState.FAILED:
        row.state = "failed"
        row.line = f"the mirror could not fetch its weights: {fetch.reason}"
    elif fetch is not None and fetch.state == FetchState.DONE:
        row.state = "current"  # what the registry had when the mirror fetched it
        row.line = f"as fetched at {fetch.commit[:12] or fetch.revision}; not checked since"
    elif why := registry.mirrored(m.source):
        row.line = f"no registry to check: {why}"
    elif rules.simulated(m):
        # Its nodes need no weights, so nothing fetches them until an update is asked for.
        row.line = "never fetched (a sim engine needs no weights): Check for updates asks the registry; Fetch now or Update fetches them"
    else:
        row.line = "not checked yet: its origin is written when the mirror first fetches it"


@role_required(VIEWER)
def updates_page(request: HtmxHttpRequest) -> HttpResponse:
    """Show every model's update state, filtered by ``q`` (name) and ``state``."""
    name = request.GET.get("q", "").strip()[:200]
    state = request.GET.get("state", "").strip()
    if state not in STATES:
        state = ""
    context = {
        "rows": rows(name, state),
        "q": name,
        "state": state,
        "states": STATES,
        "refresh_s": REFRESH_S,
        "is_operator": has_role(request.user, OPERATOR),
        "live_query": urlencode({k: v for k, v in (("q", name), ("state", state)) if v}),
    }
    if request.htmx and request.GET.get("region"):
        return render(request, "updates/updates.html#region", context)
    return render(request, "updates/updates.html", context)


def _update_part(request: Any, name: str, m: Any) -> dict[str, Any]:
    """Return what a model's panel shows of its updates (``panel_context`` adds it), and
    a fast refresh while an update runs."""
    r = UpdateRun.objects.filter(model=name).first()
    operator = has_role(request.user, OPERATOR)
    active = r is not None and r.active
    previous = m.origin is not None and m.origin.previous is not None
    return {
        "update_run": r,
        "update_state": state_of(r),
        "update_line": line_of(r),
        "update_lines": list(r.lines)[-12:] if r is not None else [],
        "can_update": operator and not active and not flow.is_candidate(name),
        "can_promote": operator
        and active
        and r is not None
        and r.step in (flow.EVAL, flow.CANARY, flow.PROMOTE),
        "can_rollback": operator and not active and previous,
        "can_cancel": operator and active,
        "update_active": active,
        "update_said": getattr(request, "update_said", ""),
        "update_refused": getattr(request, "update_refused", False),
    } | ({"refresh_s": FAST_S} if active else {})


def _answer(request: HtmxHttpRequest, name: str, said: str, refused: bool = False) -> HttpResponse:
    """Answer an action: the panel saying what was done or why not (htmx), or the model's
    page with it as a message."""
    if request.htmx:
        request.update_said, request.update_refused = said, refused  # type: ignore[attr-defined]
        return render(request, "updates/partials/model_panel.html", panel_context(request, name))
    (messages.error if refused else messages.success)(request, said)
    return redirect("catalog:servedmodel_detail", name)


def _known(name: str) -> None:
    if not stored_specs(names=[name]):
        raise Http404(f"model {name!r} is not in the catalog")


def _via(request: HtmxHttpRequest) -> str:
    return "console"


def _act(
    request: HtmxHttpRequest,
    name: str,
    action: Callable[..., Any],
    said: Callable[[Any], tuple[str, bool]],
) -> HttpResponse:
    """Do an update flow's action (``run.promote``, ``cancel``, ``rollback``) on a model as
    this console's user and answer (``_answer``) what ``said`` makes of it (the words, and
    whether it failed) or why it was refused; 404 for a model the catalog does not hold."""
    _known(name)
    try:
        done = action(name, user=request.user, surface=Surface.CONSOLE, via=_via(request))
    except flow.FlowRefused as exc:
        return _answer(request, name, str(exc), refused=True)
    words, failed = said(done)
    return _answer(request, name, words, refused=failed)


@role_required(OPERATOR)
@require_POST
def model_update(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Start an update of a model (the newest revision; auto with its own canary)."""
    auto = request.POST.get("auto", "") in ("1", "on", "true")
    return _act(request, name, partial(run.start, auto=auto),
                lambda r: (f"update #{r.pk} of {name} started", False))  # fmt: skip


@role_required(OPERATOR)
@require_POST
def model_promote(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Promote a model's running update now."""
    return _act(request, name, run.promote,
                lambda r: (r.reason, True) if r.state == "failed" else (r.lines[-1]["text"], False))  # fmt: skip


@role_required(OPERATOR)
@require_POST
def model_rollback(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Move a model back to its previous revision while the mirror holds it."""
    return _act(request, name, run.rollback, lambda said: (said, False))


@role_required(OPERATOR)
@require_POST
def model_cancel(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """End a model's running update; the model stays as it is."""
    return _act(request, name, run.cancel, lambda r: (f"update #{r.pk}: {r.reason}", False))


def region_poke(query: dict[str, str]) -> str:
    """Return what tells an open Updates page to ask for its table at once (the live view
    sends it when a model changes: an update's step, a fetch, a check): an element htmx
    loads into the page's holder, which asks with the page's own session and filters."""
    url = reverse("updates:list") + "?" + urlencode({"region": "1", **query})
    return render_to_string("updates/partials/region_poke.html", {"url": url})
