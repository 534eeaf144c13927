"""The cluster app: the actual state (nodes, cards, replicas) and the reconciler."""

from __future__ import annotations

from django.apps import AppConfig


class ClusterConfig(AppConfig):
    """Nodes, their cards, replicas, placement and the agents' API."""

    name = "cluster"
    verbose_name = "Cluster"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from cluster import signals

        signals.connect()
