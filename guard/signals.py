"""The guard's receivers, every one of them, connected in ``GuardConfig.ready`` (:func:`connect`).

- **A sample after every probe**, for a judge's chart: ``guard.services.probe_judges``
  saves each judge's ``JudgeProbe``; :func:`record_sample` keeps a ``JudgeSample`` of it
  with the judge's answers, failures and decisions so far (two queries and an insert a
  judge a probe, every ``LLMGW_PROBE_INTERVAL`` seconds).
- **The live console**: saves of a judge's health or probe, and of the policy, mark the
  judges changed (``llmgw_core.events``), pushed after commit.
- **What the check keeps in memory** is dropped when what it was read from changes in
  this process: the policy, a judge's catalog row or replica (``guard.services``'s
  snapshot), a token, a user or a user's groups (``guard.api.auth``'s tokens); a migrate
  or a flush drops both.
- **Each reconcile tick** (the cluster's ``reconcile_tick``) first serves the judges the
  policy names and the catalog lacks (``guard.hooks.serve_policy_judges``).
- **A catalog change that switches off the only judge that answers** is warned of
  (the catalog's ``change_warnings``; ``guard.hooks.switch_off_warnings``): the
  guard will then fail open or closed, as the policy's ``fail`` says.
- **A catalog change that takes a judge the policy names out of it** (deleted, renamed,
  its role changed) is refused (the catalog's ``change_refusals``;
  ``guard.hooks.policy_refusals``): take it out of the policy first.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Sum
from django.db.models.signals import m2m_changed, post_delete, post_migrate, post_save

from catalog.models import ServedModel
from catalog.signals import change_refusals, change_warnings
from cluster.models import Replica
from cluster.signals import reconcile_tick
from guard import hooks, snapshots
from guard.api import auth
from guard.models import GuardPolicy, JudgeDecision, JudgeHealth, JudgeProbe, JudgeSample
from llmgw_core import events
from llmgw_core.models import ApiToken

# Samples kept a judge: at the default one a minute, about four days.
KEEP = 6000


def record_sample(probe: JudgeProbe) -> JudgeSample:
    """Keep a sample of a judge from its latest probe and its counts so far."""
    health = (
        JudgeHealth.objects.filter(judge=probe.judge).values("answers", "failures").first() or {}
    )
    verdicts = dict(
        JudgeDecision.objects.filter(judge=probe.judge)
        .values("verdict")
        .annotate(n=Sum("count"))
        .values_list("verdict", "n")
    )
    sample = JudgeSample.objects.create(
        judge=probe.judge,
        at=probe.at,
        ok=probe.ok,
        latency_ms=probe.latency_ms,
        ordinary_verdict=probe.ordinary_verdict,
        harmful_verdict=probe.harmful_verdict,
        error=probe.error[:2000],
        answers=health.get("answers", 0),
        failures=health.get("failures", 0),
        safe=verdicts.get("safe", 0) or 0,
        unsafe=verdicts.get("unsafe", 0) or 0,
        controversial=verdicts.get("controversial", 0) or 0,
    )
    # Every hundredth sample, the oldest beyond KEEP go.
    if sample.pk % 100 == 0:
        cutoff = (
            JudgeSample.objects.filter(judge=probe.judge)
            .order_by("-at", "-id")
            .values_list("at", flat=True)[KEEP : KEEP + 1]
        )
        for at in cutoff:
            JudgeSample.objects.filter(judge=probe.judge, at__lte=at).delete()
    return sample


def _probe_saved(sender: Any, instance: JudgeProbe, **kwargs: Any) -> None:
    record_sample(instance)


# The live console.


def _judge_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    events.changed(judges=[instance.judge])


def _policy_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    # The judges' list and order may have changed: the list is sent whole.
    events.changed(judges=["*"])


# What the check keeps in memory.

# A replica's columns a check reads; a save of only others (progress, restarts) keeps
# the snapshot.
_REPLICA_FIELDS = frozenset({"model_name", "state", "desired", "endpoint", "ready_since"})


def _policy_saved(**kwargs: Any) -> None:
    snapshots.forget()


def _model_saved(instance: ServedModel, **kwargs: Any) -> None:
    snapshots.forget_if_held(instance.name)


def _replica_saved(instance: Replica, update_fields: Any = None, **kwargs: Any) -> None:
    if update_fields is not None and not (set(update_fields) & _REPLICA_FIELDS):
        return
    snapshots.forget_if_held(instance.model_name)


def _migrated(**kwargs: Any) -> None:
    # A migrate or a flush (tests) rewrote the tables under what is kept.
    snapshots.forget()
    auth.forget()


def _token_changed(**kwargs: Any) -> None:
    auth.forget()


# The catalog.


def _change_warnings(sender: Any, before: Any, after: Any, **kwargs: Any) -> list[str]:
    return hooks.switch_off_warnings(before, after)


def _change_refusals(sender: Any, before: Any, after: Any, **kwargs: Any) -> list[Any]:
    return hooks.policy_refusals(before, after)


# The reconciler.


def _tick(sender: Any, **kwargs: Any) -> None:
    # The policy may name a known judge the catalog lacks: added before the tick reads
    # the catalog, so this tick serves it.
    hooks.serve_policy_judges()


def connect() -> None:
    """Connect the receivers (``GuardConfig.ready``)."""
    post_save.connect(_probe_saved, sender=JudgeProbe, dispatch_uid="guard-judge-sample")
    post_save.connect(_judge_changed, sender=JudgeProbe, dispatch_uid="live-judge-probe")
    post_save.connect(_judge_changed, sender=JudgeHealth, dispatch_uid="live-judge-health")
    post_save.connect(_policy_changed, sender=GuardPolicy, dispatch_uid="live-guard-policy")
    user = get_user_model()
    for name, signal in (("saved", post_save), ("deleted", post_delete)):
        signal.connect(_policy_saved, sender=GuardPolicy, dispatch_uid=f"guard-policy-{name}")
        signal.connect(_model_saved, sender=ServedModel, dispatch_uid=f"guard-model-{name}")
        signal.connect(_replica_saved, sender=Replica, dispatch_uid=f"guard-replica-{name}")
        signal.connect(_token_changed, sender=ApiToken, dispatch_uid=f"guard-token-{name}")
        signal.connect(_token_changed, sender=user, dispatch_uid=f"guard-token-user-{name}")
    m2m_changed.connect(
        _token_changed, sender=user.groups.through, dispatch_uid="guard-token-groups"
    )
    post_migrate.connect(_migrated, dispatch_uid="guard-migrated")
    reconcile_tick.connect(_tick, dispatch_uid="guard-serve-policy-judges")
    change_warnings.connect(_change_warnings, dispatch_uid="guard-switch-off-warning")
    change_refusals.connect(_change_refusals, dispatch_uid="guard-judge-in-policy")
