"""The guard app: judges, the policy, the chain and their record."""

from __future__ import annotations

from django.apps import AppConfig


class GuardConfig(AppConfig):
    """Judge models judging requests and answers."""

    name = "guard"
    verbose_name = "Guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from guard import signals

        signals.connect()
