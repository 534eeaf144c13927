"""The cluster app: the actual state (nodes, cards, replicas) and the reconciler."""

from __future__ import annotations

from django.apps import AppConfig

from cluster import relay
from llmgw_core.events import Event, derive, register, relay_with


class ClusterConfig(AppConfig):
    """Nodes, their cards, replicas, placement and the agents' API."""

    name = "cluster"
    verbose_name = "Cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: they import models, which load with the apps, after this module.
        from cluster import benchrun, signals, tasks, wake  # noqa: PLC0415

        # The cluster's live events (llmgw_core.events; their renderers: cluster.live).
        register(
            Event("nodes", "cluster.nodes_changed", "cluster.nodes", "pks", int,
                  "nodes: their cards, reservations, power (an empty list: the power alone)"),
            Event("models", "cluster.models_changed", "cluster.models", "names", str,
                  "models' replicas: states, reasons, progress, rolls, unplaced"),
        )  # fmt: skip
        # ``changed(replicas=[pk])``: a replica shows as its model, read when published (a
        # replica deleted in the same transaction is named by its model instead).
        derive("replicas", "models", _models_of_replicas)
        # A process no console listens on hands its events to the embedded web process.
        relay_with(relay.hand_over)
        signals.connect()
        # The workers' tasks call the reconciler and the bench, and the wake sends through
        # the relay: these reach back through what is set here, not by an import.
        wake.to_worker = tasks.reconcile_cluster.apply_async
        benchrun.to_worker = tasks.bench_profile.delay
        relay.on_wake = wake.wake


def _models_of_replicas(pks: set[int]) -> list[str]:
    """Return the models of these replicas (those that still exist)."""
    # Imported here: models load with the apps, after this module.
    from cluster.models import Replica  # noqa: PLC0415

    return list(Replica.objects.filter(pk__in=pks).values_list("model_name", flat=True))
