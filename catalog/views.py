"""The catalog's console: list, detail, create and edit, live checks, delete, revert.

Function views, thin over ``catalog.forms`` (every check is ``check_bundle``) and
``catalog.services`` (every write, delete and revert). A page asked for by htmx answers
with a named partial of its own template (``llmgw_core.htmx.is_partial``), so the first
render and every refresh come from the same fragment.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import ZoneInfo

import yaml
from django.conf import settings
from django.contrib import messages
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect, reswap, retarget

from agent import slots
from agent.engines import ENGINES
from catalog import codec, inventory, rules, schedule, services, spec, timeouts
from catalog.choices import Surface
from catalog.durations import format_duration
from catalog.filtersets import ServedModelFilterSet, with_effective_class
from catalog.forms import (
    FORMSETS,
    WIDTH_FIELDS,
    OrderedInlineFormSet,
    ServedModelForm,
    attach_problems,
    build_formsets,
    check_bundle,
    error_map,
    file_key,
)
from catalog.models import Alias, ChangeRecord, Profile, ServedModel
from catalog.problems import Problem
from llmgw_core.htmx import HtmxHttpRequest, is_partial
from llmgw_core.roles import OPERATOR, VIEWER, role_required

# The form page's sections: a title, the model's fields in it, and the formset (if any)
# shown under them. Every field of ServedModelForm is in exactly one section
# (tests/catalog/test_views.py checks it).
SECTIONS: list[tuple[str, list[str], str | None]] = [
    (
        "Model",
        [
            "name",
            "source",
            "trust_remote_code",
            "residency",
            "description",
            "role",
            "capacity_class",
            "owner",
        ],  # fmt: skip
        None,
    ),
    ("Aliases", [], "aliases"),
    ("Profiles", [], "profiles"),
    (
        "Scaling",
        ["scaling_min", "scaling_max", "scaling_idle_timeout", "scaling_prewarm"],
        "windows",
    ),
    (
        "Serving",
        [
            "fallbacks",
            "overflow",
            "context_length",
            "max_output",
            "cached_token_weight",
            "routing_profile",
            "slo_ttft_p99",
            "slo_tpot_p99",
            "capabilities_tools",
            "capabilities_vision",
            "capabilities_embeddings",
            "capabilities_rerank",
        ],
        None,
    ),
    ("Adapters", ["max_loaded_adapters"], "adapters"),
    ("Guard", ["guard_format", "guard_categories"], None),
    (
        "Canary",
        [
            "canary_model",
            "canary_percent",
            "canary_min_requests",
            "canary_max_error_increase",
            "canary_max_ttft_ratio",
        ],
        None,
    ),
    ("Eval", ["eval_suite", "eval_min_score", "eval_judge"], None),
    (
        "External",
        ["external_url", "external_model", "external_api_key_file", "external_peer"],
        None,
    ),
    (
        "Origin",
        ["origin_repo", "origin_revision", "origin_previous_source", "origin_previous_revision"],
        "origin_files",
    ),
]

# What the "add a row" button of each formset says.
ADD_LABELS = {
    "profiles": "Add a profile",
    "windows": "Add a window",
    "adapters": "Add an adapter",
    "aliases": "Add an alias",
    "origin_files": "Add a file",
}

# An entry past this many is left to the API's change log: the page stays quick.
CHANGE_LOG_LIMIT = 50


# Week schedule picture


def week_context(scaling: spec.Scaling, leave_out: set[int] | None = None) -> dict[str, Any]:
    """Return what ``catalog/partials/week.html`` draws: the picture in the control zone.

    Used by the model's page and the schedule editor (``catalog.schedule_views``), so both
    draw the same picture with the same fragment.
    """
    zone = ZoneInfo(settings.TIME_ZONE)
    return {
        "week": schedule.picture(scaling, zone, leave_out=leave_out or set()),
        "hours": range(24),
        "time_zone": settings.TIME_ZONE,
        "prewarm_text": format_duration(scaling.prewarm) if scaling.prewarm > 0 else "",
    }


# GPU classes beside a profile's gpu_class


@dataclass(frozen=True)
class ClassNote:
    """What the model form says beside a profile's gpu_class.

    ``info``: the class on the cluster (``cluster.inventory.ClassInfo``), None when no
    node has it; ``warning``: why the profile's replicas cannot be placed on the free
    cards now, or "". Saving is never refused for it: the catalog does not know the
    cluster.
    """

    gpu_class: str
    info: Any
    warning: str


def cluster_classes() -> dict[str, Any] | None:
    """Return the cluster's GPU classes by name, or None when no inventory is known."""
    source = inventory.source()
    return None if source is None else {c.name: c for c in source.gpu_classes()}


def class_note(row: Any, classes: Mapping[str, Any] | None) -> ClassNote | None:
    """Return the note for a profile row's gpu_class as it stands, or None (no class).

    The row's width is read as the rules' ``normalize`` reads it (gpus_per_node from tp
    and nodes when not given), then measured by the inventory's ``shortfall``.
    """
    source = inventory.source()
    if classes is None or source is None:
        return None
    if row.is_bound:
        values = getattr(row, "cleaned_data", None) or {}
    else:
        values = row.initial
    p = spec.Profile(
        engine=values.get("engine") or "",
        gpu_class=(values.get("gpu_class") or "").strip(),
        tp=values.get("tp") or 0,
        pp=values.get("pp") or 0,
        gpus_per_node=values.get("gpus_per_node") or 0,
        nodes=values.get("nodes") or 0,
    )
    if not p.gpu_class:
        return None
    p = rules.normalize(spec.Model(profiles=[p])).profiles[0]
    warning = source.shortfall(classes, p.gpu_class, p.gpus_per_node, p.nodes) or ""
    return ClassNote(p.gpu_class, classes.get(p.gpu_class), warning)


def _note_rows(formsets: Mapping[str, OrderedInlineFormSet]) -> dict[str, Any]:
    """Give each profile row its class note (``row.class_note``); return the classes."""
    classes = cluster_classes()
    for row in formsets["profiles"].forms:
        row.class_note = class_note(row, classes)
    return {"gpu_classes": list(classes.values()) if classes is not None else None}


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
    """Show the catalog as a table, filtered by the query string.

    The filter form asks again with htmx and gets only the table back (``#table``); the
    query count does not grow with the number of models (prefetched rows).
    """
    filterset = listed(request.GET)
    rows = []
    for obj in filterset.qs:
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
    context = {
        "rows": rows,
        "names": [r["obj"].name for r in rows],
        # The live socket's filters: the consumer pushes the ready cells of these rows.
        "live_query": request.GET.urlencode(),
        "values": values,
        "filter_errors": filterset.errors,
        "engines": ENGINES,
        "classes": rules.CLASSES,
        "gpu_class_options": gpu_classes,
        "filtered": any(values.values()),
    }
    return render(
        request, partial_template(request, "catalog/servedmodel_list.html", "table"), context
    )


def listed(params: Mapping[str, Any]) -> ServedModelFilterSet:
    """Return the catalog list's filter over its query string (the page and the live
    view's ready column, ``llmgw_admin.consumer``, list the same models)."""
    queryset = with_effective_class(services.stored_queryset())
    return ServedModelFilterSet(params, queryset=queryset)


def listed_names(params: Mapping[str, Any]) -> set[str]:
    """Return the names the catalog list shows for these filters."""
    return set(listed(params).qs.values_list("name", flat=True))


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


# Create and edit


def _form_context(
    form: ServedModelForm,
    formsets: Mapping[str, OrderedInlineFormSet],
    replacing: str | None,
    touched: str,
) -> dict[str, Any]:
    picker = _note_rows(formsets)
    sections = [
        {
            "title": title,
            "fields": [form[n] for n in names],
            "group": group,
            "formset": formsets[group] if group else None,
            "add_label": ADD_LABELS.get(group or "", ""),
            "headers": (
                [
                    file_key(f.name)
                    for f in formsets[group].empty_form.visible_fields()
                    if f.name != "DELETE"
                ]
                if group
                else []
            ),
        }
        for title, names, group in SECTIONS
    ]
    action = (
        reverse("catalog:servedmodel_edit", args=[replacing])
        if replacing
        else reverse("catalog:servedmodel_add")
    )
    return {
        **picker,
        "form": form,
        "formsets": formsets,
        "sections": sections,
        "replacing": replacing,
        "touched": touched,
        "action": action,
        "error_count": sum(len(v) for v in error_map(form, formsets).values())
        if form.is_bound
        else 0,
    }


def _form_page(
    request: HtmxHttpRequest, instance: ServedModel, replacing: str | None
) -> HttpResponse:
    """Show the form, or check and save it (1. shape and rules, 2. save, 3. redirect).

    On any problem, the form comes back (status 200, as htmx 2 swaps only 2xx) with
    every error at its field, whether touched or not.
    """
    data = request.POST if request.method == "POST" else None
    form = ServedModelForm(data, instance=instance)
    formsets = build_formsets(data, instance)
    if data is None and replacing is None:
        # A new model needs a profile: start with one blank row (a blank row that stays
        # blank is not a row, see OrderedInlineFormSet.live_forms).
        formsets["profiles"].extra = 1
    if data is not None:
        saved = save_bundle(request, form, formsets, replacing)
        if saved is not None:
            return saved
    context = _form_context(form, formsets, replacing, "*" if data is not None else "")
    return render(
        request, partial_template(request, "catalog/servedmodel_form.html", "form"), context
    )


def save_bundle(
    request: HtmxHttpRequest,
    form: ServedModelForm,
    formsets: Mapping[str, OrderedInlineFormSet],
    replacing: str | None,
) -> HttpResponse | None:
    """Save a checked console form through the one write path; answer the redirect to the
    model's page, or None with every problem at its field (nothing saved)."""
    model = check_bundle(form, formsets, replacing)
    if model is None:
        return None
    actor = services.Actor(user=request.user, surface=Surface.CONSOLE)
    try:
        saved = services.save_model(model, actor, replacing=replacing)
    except services.Refused as exc:
        # Another change got in first: the same problems, at their fields.
        attach_problems(exc.problems, form, formsets)
        return None
    # Shown on the next page (templates/base.html), which the redirect loads whole.
    if replacing is None:
        messages.success(request, f"Added {saved.name} to the catalog.")
    else:
        messages.success(request, f"Saved {saved.name}.")
    for warning in saved.change_warnings:
        messages.warning(request, warning)
    url = reverse("catalog:servedmodel_detail", args=[saved.name])
    if request.htmx:
        return HttpResponseClientRedirect(url)
    return redirect(url)


@role_required(OPERATOR)
@require_http_methods(["GET", "POST"])
def servedmodel_add(request: HtmxHttpRequest) -> HttpResponse:
    """Show the form for a new model, and save it."""
    return _form_page(request, ServedModel(), None)


@role_required(OPERATOR)
@require_http_methods(["GET", "POST"])
def servedmodel_edit(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Show the form for a stored model, and save it in the model's place."""
    return _form_page(request, stored_model(name), name)


def _error_slots(form: ServedModelForm, formsets: Mapping[str, OrderedInlineFormSet]) -> list[str]:
    """Return the HTML names that have an error element on the form page, in order."""
    slots = ["__all__", *(form.add_prefix(n) for n in form.fields)]
    for group, fs in formsets.items():
        slots.append(f"{group}-__all__")
        for row in fs.forms:
            slots.append(f"{row.prefix}-__all__")
            slots += [row.add_prefix(f.name) for f in row.visible_fields() if f.name != "DELETE"]
    return slots


def _fold(errors: dict[str, list[str]], slots: list[str]) -> dict[str, list[str]]:
    # An error on a field with no element of its own (a row's hidden id) goes to its
    # row's general errors, else the form's.
    known = set(slots)
    out: dict[str, list[str]] = {}
    for key, found in errors.items():
        slot = key
        if slot not in known:
            row_all = key.rsplit("-", 1)[0] + "-__all__"
            slot = row_all if row_all in known else "__all__"
        out.setdefault(slot, []).extend(found)
    return out


def _shown(slot: str, touched: set[str]) -> bool:
    """Return whether a slot's errors show: its field was touched, or all are wanted."""
    if "*" in touched:
        return True
    if slot == "__all__":
        return False
    if slot.endswith("-__all__"):
        prefix = slot[: -len("__all__")]
        return any(t.startswith(prefix) for t in touched)
    return slot in touched


@role_required(OPERATOR)
@require_POST
def servedmodel_validate(request: HtmxHttpRequest) -> HttpResponse:
    """Check the form as it stands, saving nothing; answer one error element per field.

    Called by the form page whenever a field is left, and as a profile's class and width
    are typed. Each error element is swapped out of band by its id (``err-<html
    name>``); only fields in ``_touched`` (kept by ``static/llmgw/console.js``) show
    their errors, and ``*`` shows every error. A profile's class and width fields show
    together (one rule ties them), and each profile's class note comes back too.
    """
    replacing = request.POST.get("_replacing") or None
    touched = _with_width(touched_fields(request))
    instance = ServedModel()
    if replacing is not None:
        found = ServedModel.objects.filter(name=replacing).first()
        if found is None:
            slots = [("__all__", [f'model "{replacing}" is no longer in the catalog'])]
            return render(
                request, "catalog/partials/validation.html", {"slots": slots, "status": ""}
            )
        instance = found
    form = ServedModelForm(request.POST, instance=instance)
    formsets = build_formsets(request.POST, instance)
    check_bundle(form, formsets, replacing)
    context = check_answer(form, formsets, touched)
    if _note_rows(formsets)["gpu_classes"] is not None:
        context["notes"] = [(row.prefix, row.class_note) for row in formsets["profiles"].forms]
    return render(request, "catalog/partials/validation.html", context)


# Fields one rule ties together, whose message sits at one of them (max): touching
# either shows it, so a min typed above its max says so as it is typed.
_PAIRED = {"min": "max", "max": "min", "scaling_min": "scaling_max", "scaling_max": "scaling_min"}


def touched_fields(request: HtmxHttpRequest) -> set[str]:
    """Return the names in the form's ``_touched`` (``*``: every field), with the other
    of each min and max pair (the model's, a window's)."""
    touched = {t for t in request.POST.get("_touched", "").split(",") if t}
    for name in list(touched):
        prefix, dash, field = name.rpartition("-")
        if field in _PAIRED and (not dash or prefix.startswith("windows-")):
            touched.add(f"{prefix}{dash}{_PAIRED[field]}")
    return touched


def _with_width(touched: set[str]) -> set[str]:
    """Return touched, with every width field of a profile whose width was touched.

    The message of the rule tying them (tp x pp = nodes x gpus_per_node) sits at tp,
    which may be the one field of the row not typed in.
    """
    out = set(touched)
    for name in touched:
        prefix, _, field = name.rpartition("-")
        if prefix.startswith("profiles-") and field in WIDTH_FIELDS:
            out.update(f"{prefix}-{f}" for f in WIDTH_FIELDS)
    return out


def check_answer(
    form: Any, formsets: Mapping[str, OrderedInlineFormSet], touched: set[str]
) -> dict[str, Any]:
    """Return the checked form's error elements and status line, for a live check.

    Every error element of the form comes back (``slots``), empty unless its field was
    touched, so an error fixed elsewhere clears too. Used by ``servedmodel_validate``
    and the schedule editor's check (``catalog.schedule_views``).
    """
    slots = _error_slots(form, formsets)
    errors = _fold(error_map(form, formsets), slots)
    # A row ticked for deletion will not be saved: its errors do not count.
    deleted = {
        row.prefix
        for fs in formsets.values()
        for row in fs.forms
        if "DELETE" in row.fields and row["DELETE"].value()
    }
    errors = {k: v for k, v in errors.items() if k.rsplit("-", 1)[0] not in deleted}
    shown = [(slot, errors.get(slot, []) if _shown(slot, touched) else []) for slot in slots]
    total = sum(len(v) for v in errors.values())
    visible = sum(len(v) for _, v in shown)
    return {"slots": shown, "status": _status(total, visible)}


def _status(total: int, visible: int) -> str:
    if total == 0:
        return "No problems: the catalog's rules accept this model."
    hidden = total - visible
    if hidden == 0:
        return f"{total} problem{'s' if total != 1 else ''} to fix."
    return (
        f"{visible} problem{'s' if visible != 1 else ''} shown; {hidden} more in fields "
        "not filled in yet (Save shows all)."
    )


@role_required(OPERATOR)
@require_GET
def servedmodel_formrow(request: HtmxHttpRequest, group: str) -> HttpResponse:
    """Return a blank row of a formset, numbered after the rows on the page.

    The page sends its ``<group>-TOTAL_FORMS``; the answer is the row and, out of band,
    that count plus one.
    """
    if group not in FORMSETS:
        raise Http404(f"no such group: {group}")
    try:
        index = int(request.GET.get(f"{group}-TOTAL_FORMS", ""))
    except ValueError:
        return HttpResponseBadRequest(f"{group}-TOTAL_FORMS must be a whole number")
    if not 0 <= index < 1000:
        return HttpResponseBadRequest(f"{group}-TOTAL_FORMS must be 0 to 999")
    fs = FORMSETS[group](instance=ServedModel(), prefix=group)
    fs.extra = index + 1
    row = fs.forms[index]
    context = {"group": group, "row": row, "total": index + 1, "oob_total": True}
    if group == "profiles":
        context.update(_note_rows({"profiles": fs}))
    return render(request, "catalog/partials/form_row.html", context)


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
