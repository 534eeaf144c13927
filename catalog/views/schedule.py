"""The schedule editor: a model's windows, min, max and prewarm, with its week picture.

Function views, thin like the form's (``catalog.views.form``): the shape of the draft is
``catalog.forms.ScheduleForm`` and the ``windows`` formset, every rule is
``check_bundle``'s (the whole catalog, as saving would check it), the picture is
``catalog.schedule`` drawn by ``templates/catalog/partials/week.html`` (the model page's
fragment), and Save goes through ``catalog.services.save_model``, logged as a console
change. Operators and admins only: a viewer gets 403 on every view here.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods, require_POST

from catalog import convert, rules, services, spec
from catalog.forms import FORMSETS, ScheduleForm, check_bundle, file_key
from catalog.models import ServedModel
from catalog.views.form import check_answer, save_bundle, touched_fields
from catalog.views.pages import partial_template, stored_model, week_context
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, role_required


def _bundle(data: Any, obj: ServedModel) -> tuple[ScheduleForm, dict[str, Any]]:
    """Return the editor's form and its windows formset, bound to ``data`` when given."""
    form = ScheduleForm(data, instance=obj)
    formsets = {"windows": FORMSETS["windows"](data, instance=obj, prefix="windows")}
    return form, formsets


def draft_week(obj: ServedModel, form: ScheduleForm, formsets: dict[str, Any]) -> dict[str, Any]:
    """Return the week picture of the draft as it stands, and which windows it leaves out.

    Unbound, the stored schedule. Bound (and checked), the draft: its min, max and
    prewarm where they read (else the stored ones), and its windows, leaving out a
    window with an error at it (its shape or a rule, asked of ``rules.check_model``
    for the windows alone, since another field's shape error stops the whole check
    before the rules run), so nothing unreadable is drawn; the others keep their
    numbers.
    """
    fs = formsets["windows"]
    if not form.is_bound:
        return week_context(obj.to_spec().scaling)
    rows = fs.live_forms()
    scaling = convert.spec_from_instance(form.instance, {"windows": [r.instance for r in rows]})
    scaling = scaling.scaling
    leave_out = {i for i, r in enumerate(rows) if r.errors}
    for p in rules.check_model(spec.Model(scaling=scaling)):
        if p.path[:2] == ("scaling", "schedule") and len(p.path) > 2:
            leave_out.add(int(p.path[2]))
    return week_context(scaling, leave_out)


def _context(
    obj: ServedModel, form: ScheduleForm, formsets: dict[str, Any], touched: str
) -> dict[str, Any]:
    fs = formsets["windows"]
    return {
        **draft_week(obj, form, formsets),
        "obj": obj,
        "form": form,
        "fs": fs,
        "group": "windows",
        "headers": [file_key(f.name) for f in fs.empty_form.visible_fields() if f.name != "DELETE"],
        "add_label": "Add a window",
        "touched": touched,
    }


@role_required(OPERATOR)
@require_http_methods(["GET", "POST"])
def servedmodel_schedule(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Show a model's schedule editor, and save it (1. shape and rules, 2. save, 3. go).

    On any problem the editor comes back (status 200) with every error at its field and
    nothing saved; saved, the browser goes to the model's page.
    """
    obj = stored_model(name)
    data = request.POST if request.method == "POST" else None
    form, formsets = _bundle(data, obj)
    if data is not None:
        saved = save_bundle(request, form, formsets, name)
        if saved is not None:
            return saved
    context = _context(obj, form, formsets, "*" if data is not None else "")
    if data is not None:
        context["status"] = check_answer(form, formsets, {"*"})["status"]
    return render(
        request, partial_template(request, "catalog/servedmodel_schedule.html", "editor"), context
    )


@role_required(OPERATOR)
@require_POST
def servedmodel_schedule_check(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Check the editor's draft, saving nothing; answer the picture and the errors.

    Called as the editor is typed in (after a short pause) and as a field is left.
    Everything in the answer is swapped out of band by id: each field's error element
    (shown once its field was touched, as on the model form), the status line, and the
    week picture of the draft.
    """
    obj = services.stored_queryset().filter(name=name).first()
    if obj is None:
        slots = [("__all__", [f'model "{name}" is no longer in the catalog'])]
        return render(request, "catalog/partials/validation.html", {"slots": slots})
    form, formsets = _bundle(request.POST, obj)
    check_bundle(form, formsets, name)
    context = {
        **check_answer(form, formsets, touched_fields(request)),
        **draft_week(obj, form, formsets),
        "obj": obj,
        "oob": True,
    }
    return render(request, "catalog/partials/schedule_check.html", context)
