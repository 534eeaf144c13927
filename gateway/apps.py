"""The gateway app: the data path clients use, its keys, and its records."""

from __future__ import annotations

from django.apps import AppConfig

from catalog import timeouts
from gateway.records import traffic
from llmgw_core.events import Event, register


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: they import models, which load with the apps, after this module.
        from cluster import benchrun  # noqa: PLC0415
        from gateway import services, signals  # noqa: PLC0415
        from gateway.path import options  # noqa: PLC0415

        # The waits of a model whose catalog entry gives none, as the model's page tells
        # them (catalog.timeouts.explain): the gateway's settings.
        timeouts.use_site_defaults(options.waits_defaults)
        # The capacity bench drives its replica through the gateway with a client key
        # pinned to it, made for the run and revoked after it.
        benchrun.use_pinned_keys(services.pinned_key)
        # Federated peers refreshed beside the reconciler's tick (gateway.signals).
        signals.connect()

        # The gateway's live events (llmgw_core.events; their renderers: gateway.live). The
        # peers' is marked by gateway.peers when a peer's state, last error or models change
        # (and when one is added or removed). The traffic's is not keys but figures: each gateway process's last second per model, sent by
        # ``gateway.records.traffic`` with ``events.send`` once a second, never by ``changed()``.
        register(
            Event("traffic", "gateway.traffic_changed", traffic.GROUP, "models", dict,
                  "the gateway's traffic: one process's second, per model (figures, not keys)"),
            Event("peers", "gateway.peers_changed", "gateway.peers", "names", str,
                  "federated peers: state, last error, models (the panel is sent whole)"),
        )  # fmt: skip
