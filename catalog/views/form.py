"""The catalog's create and edit form: the page, its live checks and its added rows.

Function views, thin over ``catalog.forms`` (every check is ``check_bundle``) and
``catalog.services`` (every write). The live check answers with the error slots and the
status line that changed, as the schedule editor's check does (``check_answer``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.http import Http404, HttpResponse, HttpResponseBadRequest
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from catalog import inventory, rules, services, spec
from catalog.choices import Surface
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
from catalog.models import ServedModel
from catalog.views.pages import partial_template, stored_model
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, role_required

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
    and the schedule editor's check (``catalog.views.schedule``).
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
