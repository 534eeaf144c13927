"""Saves and deletions of cluster (and judge) rows mark what the live console shows as changed.

A catch-all for the ORM's saves (services, the reconciler, the admin); writes that
bypass signals (``QuerySet.update``, ``bulk_create``) call ``cluster.events.changed``
themselves. Publishing happens after commit (cluster.events).
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save

from cluster import events
from cluster.models import Assignment, Card, FacilityBudget, Node, Replica


def _replica(sender: Any, instance: Replica, **kwargs: Any) -> None:
    events.changed(models=[instance.model_name])


def _assignment(sender: Any, instance: Assignment, **kwargs: Any) -> None:
    events.changed(nodes=[instance.node_id], replicas=[instance.replica_id])


def _node(sender: Any, instance: Node, **kwargs: Any) -> None:
    events.changed(nodes=[instance.pk])


def _card(sender: Any, instance: Card, **kwargs: Any) -> None:
    events.changed(nodes=[instance.node_id])


def _budget(sender: Any, instance: FacilityBudget, **kwargs: Any) -> None:
    events.changed(power=True)


def _judge(sender: Any, instance: Any, **kwargs: Any) -> None:
    events.changed(judges=[instance.judge])


def _policy(sender: Any, instance: Any, **kwargs: Any) -> None:
    # The judges' list and order may have changed: the list is sent whole.
    events.changed(judges=["*"])


def connect() -> None:
    from guard.models import GuardPolicy, JudgeHealth, JudgeProbe

    post_save.connect(_judge, sender=JudgeProbe, dispatch_uid="live-judge-probe")
    post_save.connect(_judge, sender=JudgeHealth, dispatch_uid="live-judge-health")
    post_save.connect(_policy, sender=GuardPolicy, dispatch_uid="live-guard-policy")
    for signal in (post_save, post_delete):
        signal.connect(_replica, sender=Replica, dispatch_uid=f"live-replica-{signal}")
        signal.connect(_assignment, sender=Assignment, dispatch_uid=f"live-assign-{signal}")
        signal.connect(_node, sender=Node, dispatch_uid=f"live-node-{signal}")
        signal.connect(_card, sender=Card, dispatch_uid=f"live-card-{signal}")
        signal.connect(_budget, sender=FacilityBudget, dispatch_uid=f"live-budget-{signal}")
