"""The gateway app: the data path clients use, its keys, and its records."""

from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from catalog import timeouts
        from cluster import benchrun
        from gateway import routing, services, signals, traffic
        from llmgw_core.events import Event, register

        # The waits of a model whose catalog entry gives none, as the model's page tells
        # them (catalog.timeouts.explain): the gateway's settings.
        timeouts.use_site_defaults(routing.waits_defaults)
        # The capacity bench drives its replica through the gateway with a client key
        # pinned to it, made for the run and revoked after it.
        benchrun.use_pinned_keys(services.pinned_key)
        # Federated peers refreshed beside the reconciler's tick (gateway.signals).
        signals.connect()

        # The gateway's live event (llmgw_core.events; its renderers: gateway.live). Not
        # keys but figures: each gateway process's last second per model, sent by
        # ``gateway.traffic`` with ``events.send`` once a second, never by ``changed()``.
        register(
            Event("traffic", "gateway.traffic_changed", traffic.GROUP, "models", dict,
                  "the gateway's traffic: one process's second, per model (figures, not keys)"),
        )  # fmt: skip
