"""The project's own app: the wiring on top (the framework, API tokens included, is
``llmgw_core``)."""

from __future__ import annotations

from django.apps import AppConfig


class LlmgwAdminConfig(AppConfig):
    """The wiring: what puts the apps together."""

    name = "llmgw_admin"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Wiring from on top: the catalog's model form shows the cluster's GPU classes,
        # and the catalog never imports the cluster (imports point catalog <- cluster).
        from catalog import inventory as catalog_inventory
        from cluster import inventory

        catalog_inventory.register(inventory)
