"""The gateway app: the data path clients use, its keys, and its records."""

from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    name = "gateway"
    verbose_name = "Gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from catalog import timeouts
        from gateway import routing, traffic
        from llmgw_core.events import Event, register

        # The waits of a model whose catalog entry gives none, as the model's page tells
        # them (catalog.timeouts.explain): the gateway's settings.
        timeouts.use_site_defaults(routing.waits_defaults)

        # The gateway's live event (llmgw_core.events; its renderers: gateway.live). Not
        # keys but figures: each gateway process's last second per model, sent by
        # ``gateway.traffic`` with ``events.send`` once a second, never by ``changed()``.
        register(
            Event("traffic", "gateway.traffic_changed", traffic.GROUP, "models", dict,
                  "the gateway's traffic: one process's second, per model (figures, not keys)"),
        )  # fmt: skip
