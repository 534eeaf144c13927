"""The cluster's signals, and its receivers (connected in ``ClusterConfig.ready``).

Sent, for the layers above (which connect to it in their own ``AppConfig.ready()``; the
cluster imports none of them):

- :data:`reconcile_tick`, sent by the reconciler's leader at the start of every tick,
  before it reads the catalog, with ``now``: what a higher layer adds to the catalog
  then is served by this tick (the guard serves its policy's judges, ``guard.signals``).

Received:

- the catalog's ``catalog_changed`` (after the commit of a change to the catalog) wakes
  the reconciler (``cluster.wake``) and pushes the changed models' rows to the consoles;
- saves and deletions of the cluster's rows mark what the live console shows as changed:
  a catch-all for the ORM's saves (services, the reconciler, the admin); writes that
  bypass signals (``QuerySet.update``, ``bulk_create``) call ``llmgw_core.events.changed``
  themselves. Publishing happens after commit (llmgw_core.events).
"""

from __future__ import annotations

from typing import Any

from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal

from catalog.signals import catalog_changed
from cluster import wake
from cluster.models import Assignment, Card, ClusterAction, FacilityBudget, Node, Replica
from llmgw_core import events

# Sent with now=(the tick's time, control time zone) as a tick of the leader begins.
reconcile_tick = Signal()


def _catalog_changed(sender: Any, names: list[str], **kwargs: Any) -> None:
    # Every logged catalog change is one the reconciler acts on: it ticks now.
    wake.reconcile_soon()
    # What the consoles show of these models changed too, before any replica does: an
    # edited profile marks its replicas "old definition" (and offers Roll), a deleted
    # model's replicas are leaving.
    events.changed(models=names)


def _replica(sender: Any, instance: Replica, **kwargs: Any) -> None:
    events.changed(models=[instance.model_name])


def _assignment(sender: Any, instance: Assignment, **kwargs: Any) -> None:
    events.changed(nodes=[instance.node_id], replicas=[instance.replica_id])


def _node(sender: Any, instance: Node, **kwargs: Any) -> None:
    events.changed(nodes=[instance.pk])


def _card(sender: Any, instance: Card, **kwargs: Any) -> None:
    events.changed(nodes=[instance.node_id])


def _budget(sender: Any, instance: FacilityBudget, **kwargs: Any) -> None:
    # The nodes' event with no keys: the facility domains' power alone.
    events.changed(refresh=["nodes"])


def _action(sender: Any, instance: ClusterAction, created: bool, **kwargs: Any) -> None:
    # A cordoned node's reason names who cordoned or drained it (cluster.live), which is
    # logged after the node is written: the node is pushed again with it.
    if created and instance.action in ("cordon", "drain") and instance.target.startswith("node "):
        name = instance.target.removeprefix("node ")
        events.changed(nodes=Node.objects.filter(name=name).values_list("pk", flat=True))


def connect() -> None:
    """Connect the receivers (``ClusterConfig.ready``)."""
    catalog_changed.connect(_catalog_changed, dispatch_uid="cluster-wake-on-catalog")
    post_save.connect(_action, sender=ClusterAction, dispatch_uid="live-cluster-action")
    for signal in (post_save, post_delete):
        signal.connect(_replica, sender=Replica, dispatch_uid=f"live-replica-{signal}")
        signal.connect(_assignment, sender=Assignment, dispatch_uid=f"live-assign-{signal}")
        signal.connect(_node, sender=Node, dispatch_uid=f"live-node-{signal}")
        signal.connect(_card, sender=Card, dispatch_uid=f"live-card-{signal}")
        signal.connect(_budget, sender=FacilityBudget, dispatch_uid=f"live-budget-{signal}")
