"""What the guard's fragments show, built without a request (pages and pushes alike).

Used by the Guard page and the judges' pages (``guard.views``) and by the live view,
which renders the same fragments when the cluster changes:

- ``templates/guard/partials/judge_health.html``, one judge's health, root element id
  ``guard-judge-<slug>-health`` (``judge_dom_id``), rendered with
  ``{"row": judge_health_row(name)}``;
- ``templates/guard/partials/enable_judge.html``, the "enable a known judge" form,
  root element id ``guard-enable-judge``, rendered with ``enable_judge_context(...)``;
- ``templates/guard/partials/eval_body.html``, an evaluation's state, figures, chart
  and texts, root element id ``guard-eval-body``, rendered with ``eval_context(run)``.

Neither holds ``{% csrf_token %}``: the token is in ``hx-headers`` on ``<body>``.

The ``render_*`` functions and ``judges_changed`` at the end are the guard's renderers for
the console's live consumer (``llmgw_admin.consumer``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.db.models import Sum
from django.template.loader import render_to_string
from django.urls import reverse

from catalog import rules
from catalog.models import ServedModel
from catalog.services import stored_specs
from cluster import hints
from cluster.choices import ReplicaState
from cluster.models import Replica
from guard import charts, evalrun, known, services
from guard import evaluation as ev
from guard.breaker import CLOSED, HALF_OPEN, OPEN
from guard.models import EvalRun, JudgeBreaker, JudgeDecision, JudgeHealth, JudgeProbe
from guard.policy import FAIL_CLOSED

ENABLE_DOM_ID = "guard-enable-judge"
VERDICTS = ("safe", "unsafe", "controversial")

# Where a known judge can be served, as the enable form offers it (guard.enabling).
from guard.enabling import WHERE_CPU, WHERE_GPU, WHERE_SIM, WHERES  # noqa: E402,F401

_NOT_SLUG = re.compile(r"[^A-Za-z0-9-]+")


def judge_slug(name: str) -> str:
    """Return a judge's name as it appears in DOM ids: letters, digits and ``-`` only.

    Each run of other characters becomes one ``-`` (``qwen3guard-0.6b`` is
    ``qwen3guard-0-6b``); a name with none of those left is ``judge``.
    """
    return _NOT_SLUG.sub("-", name).strip("-") or "judge"


def judge_dom_id(name: str) -> str:
    """Return the id of a judge's health block: ``guard-judge-<slug>-health``."""
    return f"guard-judge-{judge_slug(name)}-health"


@dataclass(frozen=True)
class BreakerRow:
    """A judge's circuit breaker in one gateway process (``guard.breaker``), as it last
    changed: ``state`` closed, open or half_open; ``since`` when it got there, ``opened_at``
    when the outage began, ``next_probe`` when one check may ask it again."""

    process: str
    state: str
    since: datetime | None
    opened_at: datetime | None
    next_probe: datetime | None
    failures: int
    last_kind: str

    @property
    def state_text(self) -> str:
        return {CLOSED: "closed", OPEN: "open", HALF_OPEN: "half-open"}.get(self.state, self.state)


@dataclass(frozen=True)
class JudgeHealthRow:
    """One judge as the guard sees it now: where it is, how it answers, what it decided.

    ``status`` is ``ok`` (its last ask answered), ``failing`` (its last ask failed),
    ``no_replica`` (in the catalog, no ready replica), ``not_in_catalog`` (the policy
    names it but the catalog lacks it) or ``idle`` (never asked yet).
    """

    name: str
    slug: str
    dom_id: str
    url: str
    position: int | None
    in_catalog: bool
    format: str
    simulated: bool
    known: bool
    replicas: list[tuple[str, int]]
    ready: int
    answers: int
    failures: int
    last_error: str
    last_error_kind: str
    last_error_at: datetime | None
    last_good_at: datetime | None
    last_latency_ms: float | None
    probe: JudgeProbe | None
    decisions: dict[str, int] = field(default_factory=dict)
    status: str = "idle"
    # Its breaker in each gateway process that has had one change (none: closed in all).
    breakers: list[BreakerRow] = field(default_factory=list)
    # What it needs when it can run nowhere for want of an engine (cluster.hints), and
    # which other judge answers meanwhile: read for every row at once.
    hint: Any = None
    meanwhile: str = ""

    @property
    def breaker(self) -> str:
        """The breaker at a glance: ``open`` when it is open in any process, else
        ``half_open`` when one probes it, else ``closed``."""
        states = {b.state for b in self.breakers}
        for s in (OPEN, HALF_OPEN):
            if s in states:
                return s
        return CLOSED

    @property
    def breaker_text(self) -> str:
        return {CLOSED: "closed", OPEN: "open", HALF_OPEN: "half-open"}[self.breaker]

    @property
    def tripped(self) -> list[BreakerRow]:
        """The processes where its breaker is not closed."""
        return [b for b in self.breakers if b.state != CLOSED]

    @property
    def status_text(self) -> str:
        """Return the status in a few words."""
        return {
            "ok": "answering",
            "failing": "failing",
            "no_replica": "no ready replica",
            "not_in_catalog": "not in the catalog",
            "idle": "not asked yet",
        }[self.status]


def _status(
    in_catalog: bool, ready: int, health: JudgeHealth | None, probe: JudgeProbe | None
) -> str:
    if not in_catalog:
        return "not_in_catalog"
    good = health.last_good_at if health else None
    bad = health.last_error_at if health else None
    if probe is not None:
        good = max(filter(None, [good, probe.at if probe.ok else None]), default=None)
        bad = max(filter(None, [bad, probe.at if not probe.ok else None]), default=None)
    if bad is not None and (good is None or bad > good):
        return "failing"
    if not ready:
        return "no_replica"
    if good is not None:
        return "ok"
    return "idle"


def judge_names(policy_names: list[str] | None = None) -> list[str]:
    """Return the judges the Guard page lists: the policy's in order, then other guard models."""
    names = list(services.current_policy().judge_models if policy_names is None else policy_names)
    for name in (
        ServedModel.objects.filter(role=rules.ROLE_GUARD)
        .order_by("name")
        .values_list("name", flat=True)
    ):
        if name not in names:
            names.append(name)
    return names


def judge_health_rows(names: list[str] | None = None) -> list[JudgeHealthRow]:
    """Return the health of judges (default ``judge_names()``), in that order.

    Nine queries at most, whatever the number of judges.
    """
    policy_names = list(services.current_policy().judge_models)
    names = judge_names(policy_names) if names is None else names
    models = {
        m.name: m
        for m in ServedModel.objects.filter(name__in=names, role=rules.ROLE_GUARD).prefetch_related(
            "profiles"
        )
    }
    states: dict[str, Counter[str]] = {}
    for model_name, state in Replica.objects.filter(model_name__in=names, desired=True).values_list(
        "model_name", "state"
    ):
        states.setdefault(model_name, Counter())[state] += 1
    health = {h.judge: h for h in JudgeHealth.objects.filter(judge__in=names)}
    probes = {p.judge: p for p in JudgeProbe.objects.filter(judge__in=names)}
    breakers: dict[str, list[BreakerRow]] = {}
    for b in JudgeBreaker.objects.filter(judge__in=names).order_by("judge", "process"):
        breakers.setdefault(b.judge, []).append(
            BreakerRow(
                b.process, b.state, b.since, b.opened_at, b.next_probe, b.failures, b.last_kind
            )  # fmt: skip
        )
    decisions: dict[str, dict[str, int]] = {}
    for judge, verdict, n in (
        JudgeDecision.objects.filter(judge__in=names)
        .values("judge", "verdict")
        .annotate(n=Sum("count"))
        .values_list("judge", "verdict", "n")
    ):
        decisions.setdefault(judge, {})[verdict] = int(n or 0)
    rows = []
    for name in names:
        m = models.get(name)
        h = health.get(name)
        p = probes.get(name)
        counted = states.get(name, Counter())
        ready = counted.get(ReplicaState.READY, 0)
        order = [s.value for s in ReplicaState]
        profiles = list(m.profiles.all()) if m else []
        rows.append(
            JudgeHealthRow(
                name=name,
                slug=judge_slug(name),
                dom_id=judge_dom_id(name),
                url=reverse("guard:judge_detail", args=[name]),
                position=policy_names.index(name) + 1 if name in policy_names else None,
                in_catalog=m is not None,
                format=(m.guard_format if m else "")
                or (known.KNOWN[name].format if name in known.KNOWN else ""),
                simulated=bool(profiles) and all(pr.engine == "sim" for pr in profiles),
                known=name in known.KNOWN,
                replicas=sorted(counted.items(), key=lambda kv: order.index(kv[0])),
                ready=ready,
                answers=h.answers if h else 0,
                failures=h.failures if h else 0,
                last_error=h.last_error if h else "",
                last_error_kind=h.last_error_kind if h else "",
                last_error_at=h.last_error_at if h else None,
                last_good_at=h.last_good_at if h else None,
                last_latency_ms=h.last_latency_ms if h else None,
                probe=p,
                decisions={v: decisions.get(name, {}).get(v, 0) for v in VERDICTS},
                status=_status(m is not None, ready, h, p),
                breakers=breakers.get(name, []),
            )
        )
    return _with_hints(rows)


def meanwhile_texts(names: list[str]) -> dict[str, str]:
    """Say, for each of these judges, which of the policy's other judges answers while
    it cannot, if any (a fixed few queries for any number of judges)."""
    if not names:
        return {}
    pol = services.current_policy()
    ready = set(
        Replica.objects.filter(
            model_name__in=list(pol.judge_models), desired=True, state=ReplicaState.READY
        ).values_list("model_name", flat=True)
    )
    first = {
        name: next((j for j in pol.judge_models if j != name and j in ready), None)
        for name in names
        if name in pol.judge_models
    }
    answering = {j for j in first.values() if j is not None}
    sim = (
        {m.name for m in stored_specs(names=answering) if rules.simulated(m)}
        if answering
        else set()
    )
    what = " (a sim judge: its verdicts show the guard working; they judge nothing)"
    if pol.fail == FAIL_CLOSED:
        nobody = "No other judge of the policy answers meanwhile: texts are refused (fail: closed)."
    else:
        nobody = "No other judge of the policy answers meanwhile: texts pass unjudged (fail: open)."
    out = {}
    for name in names:
        if name not in first:
            out[name] = "It is not in the guard policy, so nothing waits for it."
        elif (j := first[name]) is not None:
            out[name] = (
                f"Meanwhile {j} answers{what if j in sim else ''}: the policy asks its judges "
                "in turn, and the first that answers decides."
            )
        else:
            out[name] = nobody
    return out


def _with_hints(rows: list[JudgeHealthRow]) -> list[JudgeHealthRow]:
    """Give each judge that is in the catalog and not answering its engine hint and who
    answers meanwhile (templates/guard/partials/judge_health.html): one read for all of
    them, so the dashboard's queries do not grow with its judges."""
    needing = [r.name for r in rows if r.in_catalog and r.status != "ok"]
    found = hints.hints_for(needing)
    meanwhile = meanwhile_texts([n for n in needing if found.get(n) is not None])
    return [
        replace(r, hint=found[r.name], meanwhile=meanwhile.get(r.name, ""))
        if found.get(r.name) is not None
        else r
        for r in rows
    ]


def judge_health_row(name: str) -> JudgeHealthRow | None:
    """Return one judge's health, or None when neither the policy nor the catalog has it."""
    in_policy = name in services.current_policy().judge_models
    if not in_policy and not ServedModel.objects.filter(name=name, role=rules.ROLE_GUARD).exists():
        return None
    return judge_health_rows([name])[0]


# Enabling a known judge


@dataclass(frozen=True)
class KnownOption:
    """A known judge as the enable form offers it."""

    name: str
    description: str
    format: str
    cpu_gb: int
    gpu_gb: float
    in_catalog: bool
    in_policy: bool


@dataclass(frozen=True)
class Outcome:
    """What enabling a judge did (``ok``) or why it did not, in lines to show."""

    ok: bool
    lines: list[str]
    judge: str = ""


def enable_judge_context(
    *,
    can_edit: bool,
    outcome: Outcome | None = None,
    selected: str = "",
    where: str = WHERE_CPU,
    add_to_policy: bool = True,
    errors: dict[str, list[str]] | None = None,
) -> dict[str, Any]:
    """Return the context of ``guard/partials/enable_judge.html``.

    ``can_edit`` says whether the form is shown (operators) or only the known list;
    ``outcome`` is what the last post did; ``errors`` the problems by field (``name``,
    ``where``).
    """
    _, classes = services.cluster_shape()
    roomiest = known.roomiest_class(classes) if classes else ""
    policy = services.current_policy()
    in_catalog = set(
        ServedModel.objects.filter(name__in=list(known.KNOWN), role=rules.ROLE_GUARD).values_list(
            "name", flat=True
        )
    )
    options = [
        KnownOption(
            name=j.name,
            description=j.description,
            format=j.format,
            cpu_gb=j.min_memory_gb,
            gpu_gb=j.gpu_gb,
            in_catalog=j.name in in_catalog,
            in_policy=j.name in policy.judge_models,
        )
        for j in known.KNOWN.values()
    ]
    return {
        "dom_id": ENABLE_DOM_ID,
        "can_edit": can_edit,
        "options": options,
        "selected": selected or known.DEFAULT_CPU_JUDGE,
        "where": where,
        "add_to_policy": add_to_policy,
        "roomiest_class": roomiest,
        "outcome": outcome,
        "errors": errors or {},
        "action": reverse("guard:judge_enable"),
    }


def _figures(s: ev.Summary) -> str:
    return f"FP {ev.percent(s.false_positive_rate)} · caught {ev.percent(s.catch_rate)}" + (
        f" · {s.failures} failed" if s.failures else ""
    )


def eval_context(run: EvalRun) -> dict[str, Any]:
    """Return what an evaluation's page shows: its figures per judge, the scores' chart,
    every text's scores, and how far a running one has got."""
    summaries, rows = evalrun.read_run(run)
    points = [
        charts.ScorePoint(
            judge=r.judge,
            position=row.position,
            label=row.label,
            score=r.score if r.verdict else None,
            flagged=r.flagged,
            text=row.text,
        )
        for row in rows
        for r in row.results
        if r is not None
    ]
    chart = charts.score_chart(run.judges, points, {s.judge: _figures(s) for s in summaries})
    asked = sum(1 for row in rows for r in row.results if r is not None)
    return {
        "run": run,
        "summaries": summaries,
        "rows": rows,
        "chart": chart,
        "asked": asked,
        "to_ask": run.texts * len(run.judges),
    }


# Fragments for the live consumer, rendered without a request.


def answering(row: JudgeHealthRow) -> bool:
    """Whether a judge answers now: in the catalog, a ready replica, its last ask not failed."""
    return row.in_catalog and row.ready > 0 and row.status != "failing"


def no_judge_warning(rows: list[JudgeHealthRow], pol: Any) -> str:
    """What the dashboard says loudly when the policy judges something and none of its
    judges answers ("" otherwise): every check then goes as the policy's ``fail`` says,
    and under ``fail: open`` (the default) that is silently nothing judged."""
    directions = list(pol.directions)
    named = [r for r in rows if r.position is not None]
    if not directions or any(answering(r) for r in named):
        return ""
    what = " and ".join(directions)
    if not named:
        why = "the policy names no judge"
    else:
        why = "; ".join(
            f"{r.name}: "
            + ("not in the catalog" if not r.in_catalog
               else "no ready replica" if not r.ready else "its last ask failed")
            for r in named
        )  # fmt: skip
    if pol.fail == FAIL_CLOSED:
        then = f"the guard fails closed: every one of the {what} is refused"
    else:
        then = f"the guard fails open: the {what} pass unjudged"
    return (
        f"No judge of the guard policy answers ({why}), so {then} (fail: {pol.fail}). "
        "Enable a judge, give one a replica, or name another in the policy."
    )


def judges_context(rows: list[JudgeHealthRow] | None = None) -> dict[str, Any]:
    """The judges' partial's context: the rows, and the warning when none answers."""
    rows = judge_health_rows() if rows is None else rows
    return {"judges": rows, "judges_warning": no_judge_warning(rows, services.current_policy())}


# Judges the dashboard lists: every one the policy names, then others by name up to this
# many in all; the rest are counted, with the Guard page that lists them all.
DASHBOARD_JUDGES = 10


def dashboard_judges_context() -> dict[str, Any]:
    """The dashboard's judges: the policy's, then others up to ``DASHBOARD_JUDGES``, the
    warning when none answers, and how many more the Guard page lists."""
    policy_names = list(services.current_policy().judge_models)
    names = judge_names(policy_names)
    shown = names[: max(len(policy_names), DASHBOARD_JUDGES)]
    return {**judges_context(judge_health_rows(shown)), "judges_more": len(names) - len(shown)}


def render_judges() -> str:
    """Return the judges' list as the dashboard renders it."""
    return render_to_string("cluster/partials/judges.html", dashboard_judges_context())


def render_eval(pk: int) -> str:
    """Return an evaluation's body as its page renders it; empty when it is gone."""
    run = EvalRun.objects.filter(pk=pk).first()
    if run is None:
        return ""
    return render_to_string("guard/partials/eval_body.html", eval_context(run))


def judges_changed(names: list[str], can_act: bool) -> dict[Any, str | None]:
    """Return the judges' list under "all".

    A handful of judges: the list is sent whole, so one joining or leaving the policy
    shows too.
    """
    return {"all": render_judges()}
