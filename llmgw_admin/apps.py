"""The project's own app: users' roles, API tokens and the house framework."""

from __future__ import annotations

from django.apps import AppConfig


class LlmgwAdminConfig(AppConfig):
    """Roles, tokens and shared wiring."""

    name = "llmgw_admin"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Wiring from on top: the catalog's model form shows the cluster's GPU classes,
        # and the catalog never imports the cluster (imports point catalog <- cluster).
        from catalog import inventory as catalog_inventory
        from cluster import inventory

        catalog_inventory.register(inventory)
