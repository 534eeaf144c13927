"""The catalog's pages: the list, a model's page, delete and revert.

Function views, thin over ``catalog.services`` (every delete and revert). A page asked for
by htmx answers with a named partial of its own template (``llmgw_core.htmx.is_partial``),
so the first render and every refresh come from the same fragment. The create and edit
form is ``catalog.views.form``, the schedule editor ``catalog.views.schedule``.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import yaml
from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from agent import slots
from agent.engines import ENGINES
from catalog import codec, rules, schedule, services, spec, timeouts
from catalog.choices import Surface
from catalog.durations import format_duration
from catalog.filtersets import ServedModelFilterSet, with_effective_class
from catalog.models import Alias, ChangeRecord, Profile, ServedModel
from catalog.problems import Problem
from llmgw_core.htmx import HtmxHttpRequest, is_partial
from llmgw_core.roles import OPERATOR, VIEWER, role_required

# An entry past this many is left to the API's change log: the page stays quick.
CHANGE_LOG_LIMIT = 50
# The catalog list's rows a page (as many as the API's pages, REST_FRAMEWORK's PAGE_SIZE).
LIST_PER_PAGE = 100


# Week schedule picture


def week_context(scaling: spec.Scaling, leave_out: set[int] | None = None) -> dict[str, Any]:
    """Return what ``catalog/partials/week.html`` draws: the picture in the control zone.

    Used by the model's page and the schedule editor (``catalog.views.schedule``), so both
    draw the same picture with the same fragment.
    """
    zone = ZoneInfo(settings.TIME_ZONE)
    return {
        "week": schedule.picture(scaling, zone, leave_out=leave_out or set()),
        "hours": range(24),
        "time_zone": settings.TIME_ZONE,
        "prewarm_text": format_duration(scaling.prewarm) if scaling.prewarm > 0 else "",
    }


# Change log


@dataclass(frozen=True)
class ChangeEntry:
    """A change-log record with its before/after as diff lines of the file's YAML."""

    record: ChangeRecord
    diff: list[tuple[str, str]]


def change_diff(before: Any, after: Any) -> list[tuple[str, str]]:
    """Return (kind, line) pairs of a unified diff between two file mappings.

    ``kind`` is ``add``, ``del``, ``hunk`` or ``ctx``; a missing side (a creation or a
    deletion) is an empty file, so every line of the other side shows.
    """
    a = _yaml_lines(before)
    b = _yaml_lines(after)
    out = []
    for line in difflib.unified_diff(a, b, lineterm="", n=2):
        # File names say nothing here, nor does the one hunk of a creation or deletion.
        if line.startswith(("---", "+++")) or (line.startswith("@@") and not (a and b)):
            continue
        kind = {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "ctx")
        out.append((kind, line))
    return out


def _yaml_lines(data: Any) -> list[str]:
    if data is None:
        return []
    # The log's JSON column keeps no key order: read the mapping back and write it
    # again, so the diff shows keys in the file's order.
    model, problems = codec.decode_model(data)
    if model is not None and not problems:
        data = codec.encode_model(model)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, default_flow_style=False)
    return text.splitlines()


# Profiles, one column each


def profile_table(profiles: list[spec.Profile]) -> list[tuple[str, list[tuple[str, Any]]]]:
    """Return every profile field as a row: (file key, one (kind, value) cell a profile).

    ``kind`` is ``text``, ``code`` or ``lines`` (a list: args, env and node_selector as
    ``KEY=VALUE``). Durations are Go durations; the last row is each fingerprint.
    """
    rows: list[tuple[str, list[tuple[str, Any]]]] = []
    for f in dataclasses.fields(spec.Profile):
        cells: list[tuple[str, Any]] = []
        for p in profiles:
            value = getattr(p, f.name)
            if isinstance(value, list):
                cells.append(("lines", list(value)))
            elif isinstance(value, dict):
                cells.append(("lines", [f"{k}={v}" for k, v in sorted(value.items())]))
            elif f.metadata.get("kind") == "duration":
                cells.append(("text", format_duration(value) if value else ""))
            elif isinstance(value, bool):
                cells.append(("text", "yes" if value else "no"))
            elif f.name == "gpu_class":
                cells.append(("code", value or "(CPU)"))
            elif f.name in ("tp", "pp", "nodes") and value <= 0:
                cells.append(("text", 1))  # unset: what the rules read it as
            else:
                cells.append(("text", value))
        rows.append((f.name, cells))
    rows.append(("fingerprint", [("code", rules.fingerprint(p)) for p in profiles]))
    return rows


# Pages


def partial_template(request: HtmxHttpRequest, name: str, partial: str) -> str:
    """Return the page's template, or its named partial when htmx asks for a fragment.

    Restoring history that htmx no longer has cached asks for the whole page (htmx puts
    the answer in place of the body), so that request gets the page.
    """
    restoring = bool(request.htmx) and request.htmx.history_restore_request
    return f"{name}#{partial}" if is_partial(request) and not restoring else name


@role_required(VIEWER)
@require_GET
def servedmodel_list(request: HtmxHttpRequest) -> HttpResponse:
    """Show the catalog as a table, filtered by the query string, a page at a time.

    ``LIST_PER_PAGE`` rows a page (``?page=N``; past the last page, the last page); the
    page links keep the filters. The filter form asks again with htmx and gets only the
    table back (``#table``); the query count does not grow with the number of models
    (the page's rows are prefetched), and only the page's rows are read and rendered.
    A page number that is not one is answered 400, saying so, with no rows.
    """
    filterset = listed(request.GET)
    number, page_error = page_number(request.GET)
    page = None if page_error else Paginator(filterset.qs, LIST_PER_PAGE).get_page(number)
    rows = []
    for obj in page.object_list if page is not None else []:
        m = obj.to_spec()  # from the prefetched rows: no query per model
        rows.append(
            {
                "obj": obj,
                "aliases": m.aliases,
                "engines": sorted({p.engine for p in m.profiles if p.engine}),
                "gpu_classes": sorted({p.gpu_class for p in m.profiles if p.gpu_class}),
                "on_demand": rules.on_demand(m.scaling),
                "external": rules.is_external(m),
                "simulated": rules.simulated(m),
            }
        )
    # Lazy: only the full page's filter form reads it.
    gpu_classes = (
        Profile.objects.exclude(gpu_class="")
        .order_by("gpu_class")
        .values_list("gpu_class", flat=True)
        .distinct()
    )
    values = {
        key: request.GET.get(key, "")
        for key in ("role", "class", "engine", "gpu_class", "owner", "on_demand", "search")
    }
    if not values["class"]:
        values["class"] = request.GET.get("capacity_class", "")
    errors = dict(filterset.errors)
    if page_error:
        errors["page"] = [page_error]
    # The page links: the list's query string but its page, so each keeps the filters.
    others = request.GET.copy()
    others.pop("page", None)
    context = {
        "rows": rows,
        "page": page,
        "page_error": page_error,
        "total": f"{page.paginator.count:,}" if page is not None else "0",
        "page_query": others.urlencode(),
        "names": [r["obj"].name for r in rows],
        # The live socket's filters and page: the consumer pushes the ready cells of the
        # rows this page shows, no other.
        "live_query": request.GET.urlencode(),
        "values": values,
        "filter_errors": errors,
        "engines": ENGINES,
        "classes": rules.CLASSES,
        "gpu_class_options": gpu_classes,
        "filtered": any(values.values()),
    }
    return render(
        request,
        partial_template(request, "catalog/servedmodel_list.html", "table"),
        context,
        status=400 if page_error else 200,
    )


def page_number(params: Mapping[str, Any]) -> tuple[int, str]:
    """Return the list's page number from ``?page=`` (1 without one), and an error or "".

    The error says what was wrong and what to write instead; the number is then 0.
    """
    raw = str(params.get("page", "") or "").strip() or "1"
    if re.fullmatch(r"[0-9]{1,9}", raw) and int(raw) >= 1:
        return int(raw), ""
    return 0, f"{raw[:20]!r} is no page number: write a whole number, 1 or more"


def listed(params: Mapping[str, Any]) -> ServedModelFilterSet:
    """Return the catalog list's filter over its query string (the page and the live
    view's ready column, ``llmgw_admin.consumer``, list the same models)."""
    queryset = with_effective_class(services.stored_queryset())
    return ServedModelFilterSet(params, queryset=queryset)


def listed_names(params: Mapping[str, Any]) -> set[str]:
    """Return the names the catalog list shows for these filters and this page.

    A model on another page, or new since the page was rendered, is not among them: its
    row is not on the page, so nothing is pushed for it.
    """
    number, error = page_number(params)
    if error:
        return set()
    names = listed(params).qs.values_list("name", flat=True)
    return set(Paginator(names, LIST_PER_PAGE).get_page(number).object_list)


def stored_model(name: str) -> ServedModel:
    """Return a stored model with its rows prefetched, or raise Http404."""
    obj = services.stored_queryset().filter(name=name).first()
    if obj is None:
        raise Http404(f'model "{name}" is not in the catalog')
    return obj  # type: ignore[no-any-return]


def _detail_context(
    obj: ServedModel,
    *,
    revert_problems: list[Problem] | None = None,
    revert_pk: int | None = None,
) -> dict[str, Any]:
    """Return what the model's page shows: the model, what is derived, depends, the log."""
    m = obj.to_spec()
    # Fallbacks, a canary and a judge may name an alias: links go to the model it means.
    refs = [*m.fallbacks, m.canary.model if m.canary else "", m.eval.judge if m.eval else "",
            m.overflow]  # fmt: skip
    alias_of = dict(
        Alias.objects.filter(name__in=[r for r in refs if r]).values_list("name", "model__name")
    )
    fallbacks = [(f, alias_of.get(f, f)) for f in m.fallbacks]
    canary = None
    if m.canary is not None:
        limits = rules.canary_limits(m.canary)
        canary = {
            "c": m.canary,
            "target": alias_of.get(m.canary.model, m.canary.model),
            "limits": [
                ("min_requests", limits[0], m.canary.min_requests <= 0),
                ("max_error_increase", limits[1], m.canary.max_error_increase <= 0),
                ("max_ttft_ratio", limits[2], m.canary.max_ttft_ratio <= 0),
            ],
        }
    records = ChangeRecord.objects.filter(model_name=obj.name).order_by("-at", "-id")
    changes = [ChangeEntry(r, change_diff(r.before, r.after)) for r in records[:CHANGE_LOG_LIMIT]]
    return {
        "obj": obj,
        "m": m,
        "effective_class": rules.effective_class(m),
        "on_demand": rules.on_demand(m.scaling),
        "simulated": rules.simulated(m),
        "kv_index": rules.kv_index(m),
        "repository": rules.repository_page(m.source),
        "slot_contexts": [
            (p.name, *slots.effective_context(m.context_length, p.args, p.engine))
            for p in m.profiles
            if slots.effective_context(m.context_length, p.args, p.engine)[1]
        ],
        "profile_rows": profile_table(m.profiles),
        # How long the gateway waits on this model, and why (catalog.timeouts).
        "gateway_waits": (
            [] if m.role == "guard" else timeouts.explain(m, timeouts.site_defaults())
        ),
        "durations": {
            key: format_duration(value) if value else ""
            for key, value in (
                ("idle_timeout", m.scaling.idle_timeout),
                ("prewarm", m.scaling.prewarm),
                ("ttft_p99", m.slo.ttft_p99),
                ("tpot_p99", m.slo.tpot_p99),
            )
        },
        **week_context(m.scaling),
        "fallbacks": fallbacks,
        "overflow": alias_of.get(m.overflow, m.overflow),
        "canary": canary,
        "judge": alias_of.get(m.eval.judge, m.eval.judge) if m.eval else "",
        "depended_on_by": services.delete_blockers(obj.name),
        "changes": changes,
        "more_changes": records.count() > CHANGE_LOG_LIMIT,
        "revert_problems": revert_problems or [],
        "revert_pk": revert_pk,
    }


@role_required(VIEWER)
@require_GET
def servedmodel_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Show everything about one model, its week schedule and its change log."""
    obj = stored_model(name)
    return render(
        request,
        partial_template(request, "catalog/servedmodel_detail.html", "content"),
        _detail_context(obj),
    )


# Delete and revert


@role_required(OPERATOR)
@require_http_methods(["GET", "POST"])
def servedmodel_delete(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Ask before deleting a model (naming what depends on it); delete on POST."""
    obj = get_object_or_404(ServedModel, name=name)
    problems: list[Problem] = []
    if request.method == "POST":
        actor = services.Actor(user=request.user, surface=Surface.CONSOLE)
        try:
            services.delete_model(name, actor)
        except services.Refused as exc:
            problems = exc.problems
        else:
            messages.success(request, f"Deleted {name} from the catalog.")
            url = reverse("catalog:servedmodel_list")
            if request.htmx:
                return HttpResponseClientRedirect(url)
            return redirect(url)
    context = {
        "obj": obj,
        "depended_on_by": services.delete_blockers(name),
        "problems": problems,
    }
    return render(request, "catalog/servedmodel_delete.html", context)


@role_required(OPERATOR)
@require_POST
def changerecord_revert(request: HtmxHttpRequest, name: str, pk: int) -> HttpResponse:
    """Put a model back as it was before a change, from the model's page.

    Refused: the problems show at the entry. Done: the page's content (log included)
    is swapped in place, or, when the revert renamed or removed the model, the browser
    goes to where the model now is.
    """
    record = get_object_or_404(ChangeRecord, pk=pk)
    actor = services.Actor(user=request.user, surface=Surface.CONSOLE)
    try:
        done = services.revert_change(record, actor)
    except services.Refused as exc:
        if request.htmx:
            return render(
                request,
                "catalog/servedmodel_detail.html#revert-problems",
                {"revert_problems": exc.problems},
            )
        context = _detail_context(stored_model(name), revert_problems=exc.problems, revert_pk=pk)
        return render(request, "catalog/servedmodel_detail.html", context)
    now = services.stored_queryset().filter(name=done.model_name).first()
    if now is None:
        url = reverse("catalog:servedmodel_list")
    else:
        url = reverse("catalog:servedmodel_detail", args=[now.name])
    if not request.htmx:
        return redirect(url)
    if now is None or now.name != name:
        return HttpResponseClientRedirect(url)
    response = render(request, "catalog/servedmodel_detail.html#content", _detail_context(now))
    # The button's own target is its entry; a revert changes the whole page.
    return reswap(retarget(response, f"#served-model-{now.pk}"), "outerHTML")
