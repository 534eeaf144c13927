"""The updates app: the weights mirror, the update check and the update flow."""

from __future__ import annotations

from django.apps import AppConfig


class UpdatesConfig(AppConfig):
    """A model's weights mirrored once, checked for updates, moved to new ones."""

    name = "updates"
    verbose_name = "Updates"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from updates import command, signals

        signals.connect()
        # The catalog command's `update` group and the admin's "Check for updates"
        # (catalog.extensions: the catalog does not import this app).
        command.register()
