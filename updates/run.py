"""The update flow's shell: start an update, move it a step at each look, promote, roll back.

``updates.flow`` decides; this reads what it decides over (the mirror's fetch, the
candidate's replica, the eval's results, the gateway's records of the canary) and writes
what it says, through the catalog's services (every catalog change logged with who and
through what surface) and the cluster's roll.

- ``start`` plans an update (refused, naming the first, while one of the model runs),
  asks the mirror for the new revision and records an ``UpdateRun``;
- ``advance`` is one look at a running update: every reconcile tick looks at each
  (``updates.signals``), so the flow moves with the cluster; an eval is run apart
  (``dispatch_eval``: a Celery task in production, a thread embedded), one at a time;
- ``promote`` moves the model to the candidate's revision and rolls its replicas;
  ``rollback`` moves it back to ``previous`` while the mirror holds its files.

An update that fails removes its candidate and the model's canary to it, and says why
(the fetch's reason, the failed cases with the score, the canary's figures).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import httpx
from django.conf import settings
from django.db import IntegrityError, close_old_connections, transaction
from django.db.models import Sum
from django.utils import timezone

from catalog import spec
from catalog.choices import Surface
from catalog.models import ChangeRecord, ServedModel
from catalog.services import Actor, Refused, delete_model, save_model, stored_queryset
from cluster import services, wake
from cluster.models import Replica
from gateway import services as gateway_services
from gateway.models import Usage
from llmgw_core import events
from updates import checking, flow, mirror, registry
from updates.evals import runner
from updates.evals import suite as suites
from updates.models import Fetch, UpdateRun, UpdateState

log = logging.getLogger(__name__)

# Lines kept a run (a long canary moves its line, it does not add one a look).
MAX_LINES = 200
# The longest an eval may run before the update gives up on it (a worker that died with it).
EVAL_LIMIT_S = 3600
# Seconds a candidate that had canary traffic is kept after its update ended (``sweep``).
DRAIN_S = 10.0
EVAL_KEY_PREFIX = "update-eval-"


def _now() -> datetime:
    return timezone.now()


def _stamp(at: datetime | None = None) -> str:
    return (at or _now()).strftime("%Y-%m-%d %H:%M:%S UTC")


def label(user: Any, via: str = "") -> str:
    """Return who did something, as the run records it: ``alice``, ``alice (token ci)``."""
    name = getattr(user, "username", "") or "system"
    return f"{name} ({via})" if via else name


def actor_for(run: UpdateRun, user: Any = None, surface: str = "", via: str = "") -> Actor:
    """Return the catalog's actor for a change an update makes: who acts now, else who
    started it, through the updates surface unless a person's surface is given."""
    if user is not None:
        return Actor(user=user, surface=surface or Surface.UPDATES, via=via)
    return Actor(user=None, surface=Surface.UPDATES, name=f"update #{run.pk}",
                 via=run.started_by)  # fmt: skip


# -- reading a run ----------------------------------------------------------------------------


def plan_of(run: UpdateRun) -> flow.Plan:
    """Return the plan a run was started with."""
    data = dict(run.plan)
    canary = data.pop("canary", None)
    data["steps"] = tuple(data.get("steps", ()))
    return flow.Plan(**data, canary=flow.CanarySettings(**canary) if canary else None)


def running() -> list[flow.Running]:
    """Return the updates that have not ended, as a refusal names them."""
    return [
        flow.Running(r.pk, r.model, r.step, r.state, r.started_by, _stamp(r.created))
        for r in UpdateRun.objects.filter(state__in=flow.ACTIVE)
    ]


def _add_line(run: UpdateRun, step: str, text: str, *, replace_last: bool = False) -> None:
    if not text:
        return
    lines = list(run.lines)
    entry = {"at": _stamp(), "step": step, "text": text}
    if replace_last and lines and lines[-1].get("step") == step:
        if lines[-1].get("text") == text:
            return
        lines[-1] = entry
    else:
        lines.append(entry)
    run.lines = lines[-MAX_LINES:]


def _mark(*names: str) -> None:
    """Mark the models live (their pages and the Updates page show the update's line)."""
    events.changed(models=[n for n in names if n])


# -- start --------------------------------------------------------------------------------------


def start(
    model_name: str,
    *,
    revision: str = "",
    auto: bool = False,
    canary_percent: int | None = None,
    user: Any = None,
    surface: str = Surface.CLI,
    via: str = "",
) -> UpdateRun:
    """Start an update of a model to ``revision`` (the newest for ""); return its run.

    Raises:
        flow.FlowRefused: the model is not in the catalog, an update of it is running (named),
            it cannot be updated, or the mirror refuses the fetch (with why).
    """
    by = label(user, via)
    commit = _resolve(model_name, revision)
    with transaction.atomic():
        row = stored_queryset().select_for_update().filter(name=model_name).first()
        if row is None:
            raise flow.FlowRefused(f'model "{model_name}" is not in the catalog')
        m = row.to_spec()
        p = flow.plan(
            m,
            running(),
            revision=revision,
            auto=auto,
            canary_percent=canary_percent,
            has_registry=registry.kind(str(m.source or "").strip()) is not None,
        )
        try:
            fetch = mirror.request_fetch(model_name, commit, by=by, surface=str(surface))
        except mirror.MirrorError as exc:
            raise flow.FlowRefused(str(exc)) from None
        run = UpdateRun(
            model=model_name,
            revision=p.revision,
            from_commit=m.origin.revision if m.origin is not None else "",
            plan=dataclasses.asdict(p),
            step=flow.FETCH,
            fetch_id=fetch.pk,
            started_by=by,
            surface=str(surface),
        )
        _add_line(
            run, flow.FETCH, f"started by {by}: fetching {p.revision or 'the newest revision'}"
        )
        try:
            with transaction.atomic():
                run.save()
        except IntegrityError:
            raise flow.FlowRefused(
                f'an update of "{model_name}" was started at the same time: see catalog update list'
            ) from None
        _mark(model_name)
    wake.reconcile_soon()
    return run


def _resolve(model_name: str, revision: str) -> str:
    """Return the commit an update goes to: ``revision``'s, or the newest, asked of the
    registry before anything is written (a branch names a commit only now).

    Raises:
        flow.FlowRefused: the model is not in the catalog, has no registry, or the registry
            cannot say (a repository gone, a revision unknown: its reason), or the model
            is at that commit already.
    """
    m = _spec(model_name)
    if m is None:
        raise flow.FlowRefused(f'model "{model_name}" is not in the catalog')
    source = str(m.source or "").strip()
    if registry.kind(source) is None:
        return ""  # flow.plan refuses it, saying why
    try:
        state = registry.latest(source, revision.strip() or None)
    except registry.RegistryError as exc:
        raise flow.FlowRefused(f"{model_name}: {exc}") from None
    at = m.origin.revision if m.origin is not None else ""
    if at and state.commit == at:
        raise flow.FlowRefused(
            f"{model_name} is at {flow.short(at)} already, "
            f"{'the newest revision' if not revision.strip() else revision.strip()}: "
            "nothing to update to"
        )
    return str(state.commit)


# -- one look ---------------------------------------------------------------------------------


def advance_all() -> list[int]:
    """Look at every running update once; return their ids (each reconcile tick)."""
    ids = list(UpdateRun.objects.filter(state=UpdateState.RUNNING).values_list("pk", flat=True))
    for pk in ids:
        try:
            advance(pk)
        except Exception:
            log.exception("update #%s: a look failed; the next tick looks again", pk)
    try:
        mirror.resume_stale()
    except Exception:
        log.exception("looking for fetches a dead worker left failed; the next tick looks again")
    try:
        end_handovers()
    except Exception:
        log.exception("ending promoted candidates' handovers failed; the next tick tries again")
    try:
        sweep()
    except Exception:
        log.exception("removing ended updates' candidates failed; the next tick tries again")
    return ids


def sweep(now: datetime | None = None) -> list[str]:
    """Delete the candidates of updates that ended ``DRAIN_S`` ago or more; return them.

    A candidate that had a canary's share is left that long after the canary is taken
    off it, so every gateway process's table has stopped sending to it and what it was
    answering is answered before its engine stops (no client request fails for it).

    A candidate's name is the model's and the revision's, so a later update to the same
    revision (after a rollback, say) has a candidate of the same name: the newest update
    of that name decides, and an older one's ending never removes it.
    """
    now = now or _now()
    ended = UpdateRun.objects.filter(
        state__in=(UpdateState.PROMOTED, UpdateState.FAILED),
        finished__lte=now - timedelta(seconds=DRAIN_S),
    ).exclude(candidate="")
    names = set(ended.values_list("candidate", flat=True))
    present = set(ServedModel.objects.filter(name__in=list(names)).values_list("name", flat=True))
    swept = []
    for name in sorted(present):
        newest = UpdateRun.objects.filter(candidate=name).order_by("-created", "-pk").first()
        if newest is None or newest.state not in (UpdateState.PROMOTED, UpdateState.FAILED):
            continue  # a later update's candidate, running
        if newest.finished is None or newest.finished > now - timedelta(seconds=DRAIN_S):
            continue  # a later update's candidate, draining
        if (
            newest.state == UpdateState.PROMOTED
            and newest.handover
            and (
                newest.handover_ended is None
                or newest.handover_ended > now - timedelta(seconds=DRAIN_S)
            )
        ):
            continue  # taking the model's traffic until its replacements are ready
        with transaction.atomic():
            delete_model(name, actor_for(newest))
            _mark(newest.model, name)
        swept.append(name)
    return swept


def advance(pk: int) -> UpdateRun | None:
    """Look at a running update once and do what its step decides; return it."""
    with transaction.atomic():
        run = (
            UpdateRun.objects.select_for_update(skip_locked=True)
            .filter(pk=pk, state=UpdateState.RUNNING)
            .first()
        )
        if run is None:
            return None
        p = plan_of(run)
        facts = _facts(run, p)
        decision = flow.decide(p, run.step, facts)
        _apply(run, p, decision)
        run.save()
        _mark(run.model, run.candidate)
    return run


def _facts(run: UpdateRun, p: flow.Plan) -> flow.Facts:
    step = run.step
    if step == flow.FETCH:
        fetch = Fetch.objects.filter(pk=run.fetch_id).first()
        if fetch is None:
            return flow.Facts(fetch_state="failed", fetch_reason="its fetch was deleted")
        if fetch.state == "done" and fetch.commit == run.from_commit:
            return flow.Facts(fetch_state="failed",
                              fetch_reason=f"the model is at {flow.short(fetch.commit)} already: nothing to update to")  # fmt: skip
        if fetch.state in ("queued", "fetching"):
            done = fetch.bytes_done / 1e6
            total = f" of {fetch.bytes_total / 1e6:.1f}" if fetch.bytes_total else ""
            _add_line(
                run, step, f"fetching {fetch.source}: {done:.1f}{total} MB", replace_last=True
            )
        return flow.Facts(fetch_state=str(fetch.state), fetch_reason=fetch.reason)
    if step == flow.CANDIDATE:
        if _spec(run.candidate) is None:
            # Deleted by hand, or by an import with --replace of a file that does not
            # list it: nothing would ever place it.
            return flow.Facts(candidate_failed=f"{run.candidate} was removed from the "
                              "catalog; start the update again")  # fmt: skip
        replicas = list(Replica.objects.filter(model_name=run.candidate, desired=True))
        if any(r.state == "ready" for r in replicas):
            return flow.Facts(candidate_ready=True)
        failed = [r for r in replicas if r.state == "failed"]
        if failed:
            return flow.Facts(candidate_failed=failed[0].reason or "its replica failed")
        waiting = next((r.reason for r in replicas if r.reason), "") or "waiting for a replica"
        return flow.Facts(candidate_waiting=f"candidate {run.candidate}: {waiting}")
    if step == flow.EVAL:
        if run.eval_started is None:
            _claim_eval(run)
            return flow.Facts()
        if run.reason and run.score is None:
            return flow.Facts(eval_error=run.reason)
        if run.score is None:
            if (_now() - run.eval_started).total_seconds() > EVAL_LIMIT_S:
                return flow.Facts(eval_error=f"it did not end within {EVAL_LIMIT_S // 60} minutes "
                                  "(its worker stopped?): start the update again")  # fmt: skip
            return flow.Facts()
        return flow.Facts(eval_done=True, score=run.score, threshold=run.threshold or 0.0,
                          failed_cases=tuple(c["case"] for c in run.failed_cases))  # fmt: skip
    if step == flow.CANARY:
        return _canary_facts(run, p)
    return flow.Facts()


def _canary_facts(run: UpdateRun, p: flow.Plan) -> flow.Facts:
    assert p.canary is not None
    least = p.canary.limits()[0]
    m = _spec(run.model)
    on = (
        m is not None
        and m.canary is not None
        and m.canary.model == run.candidate
        and m.canary.percent > 0
    )
    why = ""
    if not on:
        record = (
            ChangeRecord.objects.filter(model_name=run.model, surface=Surface.GATEWAY,
                                        at__gte=run.canary_started or run.created)
            .order_by("-at").first()
        )  # fmt: skip
        if record is not None and ": " in record.summary:
            why = record.summary.split(": ", 1)[1]
    served = _served(run)
    now = _now()
    if served >= least and run.canary_reached is None:
        run.canary_reached = now
    settled = (now - run.canary_reached).total_seconds() if run.canary_reached else 0.0
    run.canary = {"percent": p.canary.percent, "served": served, "min_requests": least,
                  "why": why}  # fmt: skip
    if on:
        _add_line(run, flow.CANARY, flow.canary_line(served, least, p.canary.percent),
                  replace_last=True)  # fmt: skip
    return flow.Facts(canary_on=on, canary_why=why, served=served, min_requests=least,
                      settled_for=settled)  # fmt: skip


def _served(run: UpdateRun) -> int:
    """Return the client requests the candidate answered (the gateway's usage records; the
    eval's own key apart)."""
    q = Usage.objects.filter(model=run.candidate)
    if run.eval_key:
        q = q.exclude(key=run.eval_key)
    return int(q.aggregate(n=Sum("requests"))["n"] or 0)


def _spec(name: str) -> spec.Model | None:
    row = stored_queryset().filter(name=name).first()
    return row.to_spec() if row is not None else None


def _apply(run: UpdateRun, p: flow.Plan, d: flow.Decision) -> None:
    if d.action == flow.Action.STAY:
        if d.line:
            _add_line(run, run.step, d.line, replace_last=True)
        return
    if d.action == flow.Action.FAIL:
        _fail(run, d.line)
        return
    _add_line(run, run.step, d.line)
    if d.action == flow.Action.GO:
        run.step = d.step
        _enter(run, p)
    elif d.action == flow.Action.WAIT:
        run.step = flow.PROMOTE
        run.state = UpdateState.WAITING
        _add_line(run, flow.PROMOTE, f"ready to promote: catalog update promote {run.model}")
    elif d.action == flow.Action.PROMOTE:
        run.step = flow.PROMOTE
        _promote(run, actor_for(run))


def _enter(run: UpdateRun, p: flow.Plan) -> None:
    """Do what a step does as it starts (``ENTRY``; a step not there does nothing)."""
    entry = ENTRY.get(run.step)
    if entry is not None:
        entry(run, p)


def _enter_candidate(run: UpdateRun, p: flow.Plan) -> None:
    """Add the candidate to the catalog, its files the update's fetch's."""
    fetch = Fetch.objects.get(pk=run.fetch_id)
    run.commit = fetch.commit
    m = _spec(run.model)
    if m is None:
        _fail(run, f'model "{run.model}" was deleted')
        return
    candidate = flow.candidate_spec(m, _revision(fetch))
    run.candidate = candidate.name
    try:
        save_model(candidate, actor_for(run), note=f"update #{run.pk}: the candidate")
    except Refused as exc:
        _fail(run, f"the catalog refused the candidate: {exc}")
        return
    # The mirror keeps files by model: the candidate's are the update's fetch's, at
    # its commit, found complete in the mirror (one registry look, no download), so
    # its nodes (a sim engine among them) take them as soon as it is placed.
    try:
        own = mirror.request_fetch(candidate.name, run.commit, by=run.started_by,
                                   surface=Surface.UPDATES, start=False)  # fmt: skip
        if own.state != "done":
            own = mirror.run_fetch(own.pk) or own
    except mirror.MirrorError as exc:
        _fail(run, f"the mirror refused the candidate's files: {exc}")
        return
    if own.state != "done":
        _fail(run, f"the mirror could not give the candidate its files: {own.reason}")
        return
    _add_line(run, flow.CANDIDATE, f"candidate {candidate.name} added: placing its replica")


def _enter_eval(run: UpdateRun, p: flow.Plan) -> None:
    """Start the eval suite against the candidate, apart from the tick."""
    _add_line(run, flow.EVAL, f"eval {p.suite}: starting")
    _claim_eval(run)


def _enter_canary(run: UpdateRun, p: flow.Plan) -> None:
    """Send the canary's share of the model's requests to the candidate."""
    assert p.canary is not None
    m = _spec(run.model)
    if m is None:
        _fail(run, f'model "{run.model}" was deleted')
        return
    try:
        save_model(flow.with_canary(m, run.candidate, p.canary), actor_for(run),
                   replacing=run.model, note=f"update #{run.pk}: the canary")  # fmt: skip
    except Refused as exc:
        _fail(run, f"the catalog refused the canary: {exc}")
        return
    run.canary_started = _now()
    _add_line(run, flow.CANARY, flow.canary_line(0, p.canary.limits()[0], p.canary.percent))


# What a step does as it starts; a fetch starts with the update, promote is its own.
ENTRY: dict[str, Callable[[UpdateRun, flow.Plan], None]] = {
    flow.CANDIDATE: _enter_candidate,
    flow.EVAL: _enter_eval,
    flow.CANARY: _enter_canary,
}


def _revision(fetch: Fetch) -> flow.Revision:
    files = tuple(
        spec.OriginFile(path=str(f["path"]), sha256=str(f.get("sha256") or ""),
                        bytes=int(f.get("bytes") or 0))
        for f in fetch.files
        if registry.is_compared(str(f["path"]), code=True)
    )  # fmt: skip
    return flow.Revision(fetch.commit, files)


def _fail(run: UpdateRun, why: str, by: str = "") -> None:
    run.state = UpdateState.FAILED
    run.reason = why
    run.finished = _now()
    run.ended_by = by
    _add_line(run, run.step, f"failed: {why}")
    try:
        _remove_candidate(run)
    except Exception as exc:  # the failure stands; what is left is said, not raised
        log.exception("update #%s: removing its candidate failed", run.pk)
        _add_line(run, run.step, f"the candidate {run.candidate} could not be removed: {exc}")


def _remove_candidate(run: UpdateRun) -> None:
    """Take the model's canary off the candidate; delete the candidate now when it never
    had clients' traffic, else leave it to ``sweep`` once drained."""
    actor = actor_for(run)
    if not run.candidate:
        return
    m = _spec(run.model)
    if m is not None and m.canary is not None and m.canary.model == run.candidate:
        save_model(flow.without_candidate(m, run.candidate), actor, replacing=run.model,
                   note=f"update #{run.pk}: the canary removed")  # fmt: skip
    if run.step in (flow.FETCH, flow.CANDIDATE, flow.EVAL) and _spec(run.candidate) is not None:
        delete_model(run.candidate, actor)
    _revoke_eval_key(run)


def _revoke_eval_key(run: UpdateRun) -> None:
    if not run.eval_key:
        return

    with contextlib.suppress(gateway_services.KeyRefused):  # revoked already
        gateway_services.revoke_key(run.eval_key, via=f"update #{run.pk}")


# -- the eval -----------------------------------------------------------------------------------


def _claim_eval(run: UpdateRun) -> None:
    run.eval_started = _now()
    pk = run.pk
    transaction.on_commit(lambda: dispatch_eval(pk))


# How an eval reaches the workers: ``updates.tasks.run_update_eval.delay``, set as the app
# starts (``updates.apps``): the tasks call the flow, never the other way round.
eval_to_worker: Callable[..., object] | None = None


def dispatch_eval(pk: int) -> None:
    """Run a run's eval in the background: the worker in production, a thread embedded."""
    if settings.REDIS_URL:
        if eval_to_worker is None:
            raise RuntimeError("the updates app is not ready: no way to the workers is set")
        eval_to_worker(pk=pk)
    else:
        threading.Thread(target=_eval_in_thread, args=(pk,), name=f"update-eval-{pk}",
                         daemon=True).start()  # fmt: skip


def _eval_in_thread(pk: int) -> None:
    try:
        run_eval(pk)
    except Exception:
        log.exception("update #%s: the eval failed", pk)
    finally:
        close_old_connections()


def run_eval(pk: int) -> None:
    """Run a run's eval suite through the gateway against its candidate; write the score.

    A client key of its own (``update-eval-<pk>``, naming the candidate alone) is made
    for it and revoked at the end; its secret is never stored.

    A task may be delivered twice (a publish retried after Redis answered it late, and
    the queue took both): the delivery that claims the run (its ``eval_key`` written, in
    one statement) runs the eval, any other does nothing, so a second never fails the
    update on the first one's key.
    """
    name = f"{EVAL_KEY_PREFIX}{pk}"
    claimed = UpdateRun.objects.filter(
        pk=pk, state=UpdateState.RUNNING, step=flow.EVAL, score__isnull=True, eval_key=""
    ).update(eval_key=name)
    if not claimed:
        log.info("update #%s: its eval runs already or ran (a second delivery): nothing to do", pk)
        return
    run = UpdateRun.objects.get(pk=pk)
    p = plan_of(run)
    try:
        loaded = runner.load(p.suite)
    except runner.SuiteRefused as exc:
        UpdateRun.objects.filter(pk=pk).update(reason=str(exc)[:4000])
        _poke(run)
        return
    suite = loaded.suite
    at = suites.threshold(suite, p.min_score)
    try:
        _, secret = gateway_services.create_key(name, models=[run.candidate], via=f"update #{pk}")
    except Exception as exc:
        UpdateRun.objects.filter(pk=pk).update(reason=f"no client key for the eval: {exc}"[:4000])
        _poke(run)
        return
    UpdateRun.objects.filter(pk=pk).update(eval_total=len(suite.cases), threshold=at)
    passed = 0

    def progress(result: suites.Result, done: int) -> None:
        nonlocal passed
        passed += int(result.passed)
        UpdateRun.objects.filter(pk=pk).update(eval_done=done, eval_passed=passed)
        _poke(run, live_only=True)

    try:
        target = runner.Target(settings.LLMGW_GATEWAY_URL, secret, run.candidate)
        with httpx.Client() as http:
            why = runner.wait_ready(http, target)
        if why:
            UpdateRun.objects.filter(pk=pk).update(reason=f"the eval could not start: {why}"[:4000])
            _poke(run)
            return
        results = runner.run(suite, target, grader=runner.judge_grader(p.judge),
                             on_result=progress)  # fmt: skip
    finally:
        with contextlib.suppress(gateway_services.KeyRefused):
            gateway_services.revoke_key(name, via=f"update #{pk}")
    failed = [r.as_dict() for r in results if not r.passed]
    UpdateRun.objects.filter(pk=pk).update(
        score=suites.score(results, len(suite.cases)), failed_cases=failed
    )
    _poke(run)


def _poke(run: UpdateRun, live_only: bool = False) -> None:
    _mark(run.model, run.candidate)
    if not live_only:
        wake.reconcile_soon()


# -- promote and rollback ---------------------------------------------------------------------


def cancel(
    model_name: str, *, user: Any = None, surface: str = Surface.CLI, via: str = ""
) -> UpdateRun:
    """End a model's running update as failed, "cancelled by <who>": its candidate and the
    canary to it are removed, the model is as it was.

    Raises:
        flow.FlowRefused: no update of the model is running.
    """
    by = label(user, via)
    with transaction.atomic():
        run = (
            UpdateRun.objects.select_for_update()
            .filter(model=model_name, state__in=flow.ACTIVE)
            .first()
        )
        if run is None:
            raise flow.FlowRefused(f'no update of "{model_name}" is running')
        _fail(run, f"cancelled by {by}", by=by)
        run.save()
        _mark(run.model, run.candidate)
    return run


def promote(
    model_name: str, *, user: Any = None, surface: str = Surface.CLI, via: str = ""
) -> UpdateRun:
    """Promote a model's update now (one waiting, or running past its fetch and candidate).

    Raises:
        flow.FlowRefused: no update of the model to promote, or its candidate is not ready.
    """
    with transaction.atomic():
        run = (
            UpdateRun.objects.select_for_update()
            .filter(model=model_name, state__in=flow.ACTIVE)
            .first()
        )
        if run is None:
            raise flow.FlowRefused(f'no update of "{model_name}" is running: start one first')
        if run.step in (flow.FETCH, flow.CANDIDATE) or not run.candidate:
            raise flow.FlowRefused(
                f"update #{run.pk} of {model_name} is at its {run.step} step: its candidate "
                "is not ready to promote yet"
            )
        if run.step == flow.EVAL and run.score is None:
            raise flow.FlowRefused(
                f"update #{run.pk} of {model_name} is being evaluated: wait for its score"
            )
        if run.step == flow.EVAL and run.score < (run.threshold or 0.0) - 1e-9:
            raise flow.FlowRefused(
                f"update #{run.pk} of {model_name} scored {run.score:.2f}, below "
                f"{run.threshold:.2f}: its eval failed; it cannot be promoted"
            )
        _promote(run, actor_for(run, user, surface, via), ended_by=label(user, via))
        run.save()
        _mark(run.model, run.candidate)
    return run


def _promote(run: UpdateRun, actor: Actor, ended_by: str = "") -> None:
    fetch = Fetch.objects.get(pk=run.fetch_id)
    m = _spec(run.model)
    if m is None:
        _fail(run, f'model "{run.model}" was deleted')
        return
    promoted = flow.promoted_spec(m, run.candidate, _revision(fetch))
    try:
        save_model(promoted, actor, replacing=run.model,
                   note=f"update #{run.pk}: promoted to {flow.short(run.commit)}")  # fmt: skip
    except Refused as exc:
        _fail(run, f"the catalog refused the promote: {exc}")
        return
    _check_moved(run.model, m.origin, promoted.origin)
    # The canary is off the candidate from this change; it takes the model's traffic as
    # its first fallback until the roll's replacements are ready (``end_handovers``), then
    # goes once drained (``sweep``).
    _revoke_eval_key(run)
    rolled = services.roll(run.model, every=True)
    run.state = UpdateState.PROMOTED
    run.finished = _now()
    run.ended_by = ended_by or run.ended_by
    run.handover = list(rolled)
    _add_line(run, flow.PROMOTE,
              f"promoted to {flow.short(run.commit)} by {ended_by or 'the update (auto)'}: "
              f"rolling {len(rolled)} replica{'s' if len(rolled) != 1 else ''}"
              + (f"; {run.candidate} takes {run.model}'s traffic until "
                 f"{'they are' if len(rolled) != 1 else 'it is'} ready" if rolled else ""))  # fmt: skip
    if not rolled:
        _end_handover(run, "")


def end_handovers(now: datetime | None = None) -> list[int]:
    """Take each promoted candidate off its model's fallbacks once the roll's replacements
    are ready (or failed, or gone, or past ``flow.HANDOVER_LIMIT_S``); return the runs
    whose handover ended (each reconcile tick, before ``sweep``)."""
    now = now or _now()
    ended = []
    for pk in (
        UpdateRun.objects.filter(state=UpdateState.PROMOTED, handover_ended__isnull=True)
        .exclude(candidate="")
        .values_list("pk", flat=True)
    ):
        with transaction.atomic():
            run = (
                UpdateRun.objects.select_for_update(skip_locked=True)
                .filter(pk=pk, handover_ended__isnull=True)
                .first()
            )
            if run is None:
                continue
            ids = [int(i) for i in run.handover]
            states: dict[int, str | None] = dict.fromkeys(ids)
            for rid, state in Replica.objects.filter(pk__in=ids, desired=True).values_list(
                "pk", "state"
            ):
                states[rid] = str(state)
            waited = (now - run.finished).total_seconds() if run.finished else 0.0
            line = flow.handover_over(run.model, run.candidate, states, waited)
            if not line:
                continue
            _end_handover(run, line, now)
            run.save()
            _mark(run.model, run.candidate)
        ended.append(pk)
    return ended


def _end_handover(run: UpdateRun, line: str, now: datetime | None = None) -> None:
    """Take the candidate off the model's fallbacks and say why (``line``)."""
    m = _spec(run.model)
    if m is not None and run.candidate in m.fallbacks:
        try:
            save_model(flow.without_handover(m, run.candidate), actor_for(run),
                       replacing=run.model,
                       note=f"update #{run.pk}: {run.candidate} no longer takes its traffic")  # fmt: skip
        except Refused as exc:
            line = f"{line}; the catalog refused taking {run.candidate} off the fallbacks: {exc}"
    run.handover_ended = now or _now()
    _add_line(run, flow.PROMOTE, line)


def _check_moved(name: str, before: Any, after: Any) -> None:
    """Make the model's last update check true again (``checking.moved``); a failure
    leaves it to the next check."""
    try:
        with transaction.atomic():
            checking.moved(name, before, after)
    except Exception:
        log.exception("making %s's last update check true again failed", name)


def rollback(
    model_name: str, *, user: Any = None, surface: str = Surface.CLI, via: str = ""
) -> str:
    """Move a model back to its previous revision while the mirror holds it; return what
    was done, for a person.

    Raises:
        flow.FlowRefused: an update of it is running, it has no previous revision, or the
            mirror no longer holds that revision's files (it says so).
    """
    with transaction.atomic():
        row = stored_queryset().select_for_update().filter(name=model_name).first()
        if row is None:
            raise flow.FlowRefused(f'model "{model_name}" is not in the catalog')
        active = UpdateRun.objects.filter(model=model_name, state__in=flow.ACTIVE).first()
        if active is not None:
            raise flow.FlowRefused(
                f"update #{active.pk} of {model_name} is running (its {active.step} step): "
                "let it end first; a failed update changes nothing to go back from"
            )
        m = row.to_spec()
        back = flow.rollback_spec(m)
        # A promoted candidate still taking the model's traffic holds the weights gone back
        # from: it stops now.
        handing = list(
            UpdateRun.objects.select_for_update()
            .filter(model=model_name, state=UpdateState.PROMOTED, handover_ended__isnull=True)
            .exclude(candidate="")
        )
        for h in handing:
            back = flow.without_handover(back, h.candidate)
        prev = back.origin.revision if back.origin is not None else ""
        if mirror.enabled() and mirror.local_path(model_name, prev) is None:
            raise flow.FlowRefused(
                f"the mirror no longer holds {model_name} at {flow.short(prev)}: it cannot be "
                "gone back to (start an update to that revision instead: catalog update start "
                f"{model_name} --revision {prev})"
            )
        actor = Actor(user=user, surface=surface, via=via)
        try:
            save_model(back, actor, replacing=model_name, note=f"rolled back to {flow.short(prev)}")
        except Refused as exc:
            raise flow.FlowRefused(f"the catalog refused the rollback: {exc}") from None
        for h in handing:
            h.handover_ended = _now()
            _add_line(h, flow.PROMOTE, f"rolled back: {h.candidate} stops taking "
                      f"{model_name}'s traffic")  # fmt: skip
            h.save()
        rolled = services.roll(model_name, every=True)
        _check_moved(model_name, m.origin, back.origin)
        _mark(model_name)
    return (
        f"{model_name} is back at {flow.short(prev)} (from {flow.short(m.origin.revision)}): "  # type: ignore[union-attr]
        f"rolling {len(rolled)} replica{'s' if len(rolled) != 1 else ''}"
    )
