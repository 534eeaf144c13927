"""The catalog app: the desired state of the cluster."""

from __future__ import annotations

from django.apps import AppConfig


class CatalogConfig(AppConfig):
    """Models, their profiles and the rules they keep."""

    name = "catalog"
    verbose_name = "Catalog"
    default_auto_field = "django.db.models.BigAutoField"
