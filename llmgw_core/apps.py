"""The framework's app: it holds the API token's model (``llmgw_core.models``)."""

from __future__ import annotations

from django.apps import AppConfig


class LlmgwCoreConfig(AppConfig):
    """API tokens and what every app builds on."""

    name = "llmgw_core"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"
