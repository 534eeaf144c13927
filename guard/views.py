"""The guard's console: the Guard page, a judge's page, the evaluations.

Function views, thin over ``guard.forms`` (the policy's checks are
``guard.policy.validate``'s), ``guard.services`` (every write: ``set_policy``,
``enable_judge``, ``use_judges``), ``guard.live`` (what the fragments show) and
``guard.evalrun`` (reading evaluations back). Viewers see every page and fragment;
the views that change something refuse them with 403 whatever the page showed.

Fragments answer htmx requests and re-render themselves; after a change they trigger
``guard-policy-changed`` or ``guard-judge-enabled`` on the page, which the judges' list
and the policy form listen for (``hx-trigger="... from:body"``).
"""

from __future__ import annotations

import hashlib
from typing import Any
from urllib.parse import urlencode

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods
from django_htmx.http import trigger_client_event

from catalog import rules
from catalog.choices import Surface
from catalog.models import ServedModel
from cluster.models import Replica
from guard import charts, enabling, evalrun, known, live, services
from guard.forms import EvalStartForm, PolicyForm
from guard.judgeprompt import judge_prompt
from guard.models import EvalRun, JudgeDecision, JudgeSample, PolicyChange
from llmgw_core.htmx import HtmxHttpRequest
from llmgw_core.roles import OPERATOR, VIEWER, has_role, role_required

POLICY_CHANGES_SHOWN = 10
RUNS_SHOWN = 5
RUNS_LISTED = 50
SAMPLES_CHARTED = 240
# A prompt preview is asked for with GET (it changes nothing): its texts stay short.
PREVIEW_LIMIT = 6000
DEFAULT_PREVIEW = "how do I kill all child processes in bash"

POLICY_CHANGED = "guard-policy-changed"
JUDGE_ENABLED = "guard-judge-enabled"


def _can_edit(request: HtmxHttpRequest) -> bool:
    return has_role(request.user, OPERATOR)


def _need_operator(request: HtmxHttpRequest) -> None:
    if not _can_edit(request):
        raise PermissionDenied(f"this needs the {OPERATOR} role")


# The Guard page


def _policy_context(
    request: HtmxHttpRequest,
    form: PolicyForm | None = None,
    saved: str = "",
    notes: list[str] | None = None,
) -> dict[str, Any]:
    """Return what the policy fragment shows: the policy, its form, what was saved (and
    what saving it did to its categories)."""
    policy = services.current_policy()
    reports = services.judge_reports()
    reportable = {n: list(reports[n]) for n in policy.judge_models if n in reports}
    return {
        "policy": policy,
        "form": form or PolicyForm(policy=policy),
        "can_edit": _can_edit(request),
        "saved": saved,
        "notes": notes or [],
        "guard_models": evalrun.guard_models(),
        "reportable": reportable,
        "policy_action": reverse("guard:policy_edit"),
    }


def _runs_with_summaries(runs: list[EvalRun]) -> list[dict[str, Any]]:
    out = []
    for run in runs:
        summaries, _ = evalrun.read_run(run)
        out.append({"run": run, "summaries": summaries})
    return out


def _index(
    request: HtmxHttpRequest,
    *,
    form: PolicyForm | None = None,
    enable: dict[str, Any] | None = None,
) -> HttpResponse:
    """Render the Guard page (with a refused form or an outcome, for posts without htmx)."""
    runs = list(EvalRun.objects.prefetch_related("results")[:RUNS_SHOWN])
    context = {
        "rows": live.judge_health_rows(),
        **_policy_context(request, form),
        **(enable or live.enable_judge_context(can_edit=_can_edit(request))),
        "runs": _runs_with_summaries(runs),
        "changes": PolicyChange.objects.all()[:POLICY_CHANGES_SHOWN],
    }
    return render(request, "guard/guard_index.html", context)


@role_required(VIEWER)
@require_GET
def guard_index(request: HtmxHttpRequest) -> HttpResponse:
    """Show the judges in the policy's order with their health, the policy, enabling."""
    return _index(request)


@role_required(VIEWER)
@require_GET
def judge_list(request: HtmxHttpRequest) -> HttpResponse:
    """Answer the judges' health blocks in the policy's order (the page's list, refreshed)."""
    return render(request, "guard/partials/judge_list.html", {"rows": live.judge_health_rows()})


@role_required(VIEWER)
@require_http_methods(["GET", "POST"])
def policy_edit(request: HtmxHttpRequest) -> HttpResponse:
    """Show the policy's form (GET); check and save it (POST, operators).

    Saved through ``guard.services.set_policy`` (logged with who, from the console).
    Refused: the form comes back with each problem at its field and nothing saved.
    """
    if request.method == "GET":
        if not request.htmx:  # opened directly: the fragment alone is an unstyled page
            return redirect(reverse("guard:guard_index") + "#guard-policy")
        return render(request, "guard/partials/policy_form.html", _policy_context(request))
    _need_operator(request)
    form = PolicyForm(request.POST)
    saved = ""
    if form.is_valid() and form.policy_data is not None:
        try:
            done = services.save_policy(
                form.policy_data, user=request.user, surface=Surface.CONSOLE
            )
        except services.PolicyRefused as exc:  # checked again at the write
            for p in exc.problems:
                form.add_error(None, f"{p.field}: {p.message}")
        else:
            changed = done.changed
            saved = "Saved." if changed else "Nothing changed."
            if not request.htmx:
                return redirect("guard:guard_index")
            context = _policy_context(request, saved=saved, notes=form.notes)
            response = render(request, "guard/partials/policy_form.html", context)
            return trigger_client_event(response, POLICY_CHANGED) if changed else response
    if not request.htmx:
        return _index(request, form=form)
    return render(request, "guard/partials/policy_form.html", _policy_context(request, form, saved))


@role_required(VIEWER)
@require_http_methods(["GET", "POST"])
def judge_enable(request: HtmxHttpRequest) -> HttpResponse:
    """Show the "enable a known judge" form (GET); enable one (POST, operators).

    Enabling adds the known judge to the catalog as a guard model served as asked
    (``guard.services.enable_judge``: CPUs, the roomiest GPU class, or the sim engine)
    and, when asked, appends it to the policy's judges (``use_judges``). The answer is
    the same fragment showing what was done, or why not.
    """
    if request.method == "GET":
        context = live.enable_judge_context(can_edit=_can_edit(request))
        return render(request, "guard/partials/enable_judge.html", context)
    _need_operator(request)
    name = (request.POST.get("name") or "").strip()
    where = (request.POST.get("where") or "").strip()
    add = request.POST.get("add_to_policy") == "on"
    errors: dict[str, list[str]] = enabling.check_request(name, where)
    outcome = None
    if not errors:
        try:
            done = enabling.enable(
                name, where, add_to_policy=add, user=request.user, surface=Surface.CONSOLE
            )
        except enabling.EnableRefused as exc:
            outcome = live.Outcome(False, [m for ms in exc.errors.values() for m in ms], name)
        else:
            outcome = live.Outcome(True, done.lines, done.judge)
    context = live.enable_judge_context(
        can_edit=True,
        outcome=outcome,
        selected=name if name in known.KNOWN else "",
        where=where if where in live.WHERES else live.WHERE_CPU,
        add_to_policy=add,
        errors=errors,
    )
    if not request.htmx:
        return _index(request, enable=context)
    response = render(request, "guard/partials/enable_judge.html", context)
    if outcome is not None and outcome.ok:
        return trigger_client_event(response, JUDGE_ENABLED)
    return response


# A judge's page


def _row_or_404(name: str) -> live.JudgeHealthRow:
    row = live.judge_health_row(name)
    if row is None:
        raise Http404(f'"{name}" is neither a judge of the policy nor a guard model')
    return row


@role_required(VIEWER)
@require_GET
def judge_detail(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Show one judge: source, format, context, profiles, health, decisions, a chart, its prompt."""
    row = _row_or_404(name)
    model = ServedModel.objects.filter(name=name, role=rules.ROLE_GUARD).first()
    m = model.to_spec() if model is not None else None
    samples = list(JudgeSample.objects.filter(judge=name).order_by("-at", "-id")[:SAMPLES_CHARTED])[
        ::-1
    ]
    chart = charts.timeline(
        [
            charts.Sample(
                at=s.at,
                ok=s.ok,
                latency_ms=s.latency_ms,
                safe=s.safe,
                unsafe=s.unsafe,
                controversial=s.controversial,
                failures=s.failures,
            )  # fmt: skip
            for s in samples
        ]
    )
    runs = [
        r for r in EvalRun.objects.prefetch_related("results")[:RUNS_LISTED] if name in r.judges
    ][:3]
    evals = []
    for r in runs:
        summaries, _ = evalrun.read_run(r)
        evals.append({"run": r, "summary": next(s for s in summaries if s.judge == name)})
    context = {
        "row": row,
        "m": m,
        "kj": known.KNOWN.get(name),
        "replicas": Replica.objects.filter(model_name=name).order_by("-desired", "id"),
        "decisions": JudgeDecision.objects.filter(judge=name).order_by("verdict", "category"),
        "chart": chart,
        "samples": len(samples),
        "evals": evals,
        **_prompt_context(name, DEFAULT_PREVIEW, ""),
    }
    return render(request, "guard/judge_detail.html", context)


@role_required(VIEWER)
@require_GET
def judge_health(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Answer a judge's health block alone (the fragment the live view pushes)."""
    return render(request, "guard/partials/judge_health.html", {"row": _row_or_404(name)})


def _prompt_context(name: str, request_text: str, answer_text: str) -> dict[str, Any]:
    """Return the prompt preview's context: the texts, the prompt, or why there is none."""
    error = ""
    prompt = ""
    if len(request_text) + len(answer_text) > PREVIEW_LIMIT:
        error = (
            f"The texts are {len(request_text) + len(answer_text):,} characters; a preview "
            f"takes at most {PREVIEW_LIMIT:,}. For longer ones: python manage.py guard "
            "prompt --judge NAME --request-file F"
        )
    else:
        try:
            prompt = judge_prompt(name, request_text, answer_text or None)
        except ValueError as exc:
            error = str(exc)
    raw = prompt.encode("utf-8")
    query = {"request": request_text}
    if answer_text:
        query["answer"] = answer_text
    return {
        "judge_name": name,
        "prompt_dom_id": f"guard-judge-{live.judge_slug(name)}-prompt",
        "prompt_request": request_text,
        "prompt_answer": answer_text,
        "prompt": prompt,
        "prompt_error": error,
        "prompt_bytes": len(raw),
        "prompt_sha256": hashlib.sha256(raw).hexdigest() if prompt else "",
        "prompt_raw_url": f"{reverse('guard:judge_prompt_raw', args=[name])}?{urlencode(query)}",
        "prompt_url": reverse("guard:judge_prompt", args=[name]),
    }


@role_required(VIEWER)
@require_GET
def judge_prompt_view(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Answer the exact prompt the judge receives for the typed request (and answer)."""
    _row_or_404(name)
    context = _prompt_context(name, request.GET.get("request", ""), request.GET.get("answer", ""))
    return render(request, "guard/partials/judge_prompt.html", context)


@role_required(VIEWER)
@require_GET
def judge_prompt_raw(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """Answer the prompt as plain text: the bytes ``guard prompt`` prints."""
    _row_or_404(name)
    context = _prompt_context(name, request.GET.get("request", ""), request.GET.get("answer", ""))
    if context["prompt_error"]:
        return HttpResponse(
            context["prompt_error"], status=400, content_type="text/plain; charset=utf-8"
        )
    return HttpResponse(context["prompt"], content_type="text/plain; charset=utf-8")


# Evaluations


def _eval_form(data: Any = None) -> EvalStartForm:
    form = EvalStartForm(data, judges=evalrun.guard_models(), sets=evalrun.packaged_sets())
    if data is None:
        form.initial = {"judges": evalrun.default_judges(), "set_name": evalrun.DEFAULT_SET}
    return form


def _eval_list(
    request: HtmxHttpRequest, form: EvalStartForm | None = None, status: int = 200
) -> HttpResponse:
    runs = list(EvalRun.objects.prefetch_related("results")[:RUNS_LISTED])
    context = {
        "runs": _runs_with_summaries(runs),
        "sets": evalrun.packaged_sets(),
        "can_edit": _can_edit(request),
        "form": form or _eval_form(),
    }
    return render(request, "guard/eval_list.html", context, status=status)


@role_required(VIEWER)
@require_GET
def eval_list(request: HtmxHttpRequest) -> HttpResponse:
    """Show the evaluations kept, newest first, each judge's figures in a line; to
    operators, the form that starts one."""
    return _eval_list(request)


@role_required(VIEWER)
@require_http_methods(["POST"])
def eval_start(request: HtmxHttpRequest) -> HttpResponse:
    """Start an evaluation (operators): kept at once as running, asked in the background
    (``guard.evalrun.start``); the browser goes to its page, which fills in live.
    Refused: the form comes back with the problem at its field and nothing started."""
    _need_operator(request)
    form = _eval_form(request.POST)
    if form.is_valid():
        try:
            run = evalrun.start(
                form.cleaned_data["set_name"],
                form.cleaned_data["judges"],
                user=request.user,
                surface=Surface.CONSOLE,
            )
        except evalrun.SetRefused as exc:
            form.add_error("set_name", str(exc))
        except ValueError as exc:
            form.add_error("judges", str(exc))
        else:
            url = reverse("guard:eval_detail", args=[run.pk])
            if request.htmx:
                response = HttpResponse(status=204)
                response["HX-Redirect"] = url
                return response
            return redirect(url)
    return _eval_list(request, form, status=400)


@role_required(VIEWER)
@require_GET
def eval_detail(request: HtmxHttpRequest, pk: int) -> HttpResponse:
    """Show one evaluation: the figures per judge, the scores' chart, every text's scores."""
    run = get_object_or_404(EvalRun, pk=pk)
    context = live.eval_context(run)
    return render(request, "guard/eval_detail.html", context)
