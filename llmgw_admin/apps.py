"""The project's own app: users' roles, API tokens and the house framework."""

from __future__ import annotations

from django.apps import AppConfig


class LlmgwAdminConfig(AppConfig):
    """Roles, tokens and shared wiring."""

    name = "llmgw_admin"
    verbose_name = "Access"
    default_auto_field = "django.db.models.BigAutoField"
