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
        # Imported here: in ready(): the apps are loaded only now.
        from catalog import inventory as catalog_inventory  # noqa: PLC0415

        # Imported here: in ready(): the apps are loaded only now.
        from cluster import inventory  # noqa: PLC0415

        catalog_inventory.register(inventory)
