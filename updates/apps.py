"""The updates app: the weights mirror, the update check and the update flow."""

from __future__ import annotations

from django.apps import AppConfig


class UpdatesConfig(AppConfig):
    """A model's weights mirrored once, checked for updates, moved to new ones."""

    name = "updates"
    verbose_name = "Updates"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: they import models, which load with the apps, after this module.
        from updates import command, run, signals, tasks  # noqa: PLC0415
        from updates.mirror import fetches  # noqa: PLC0415

        signals.connect()
        # The workers' tasks call the mirror and the flow; these reach the workers through them.
        fetches.to_worker = tasks.fetch_into_mirror.delay
        run.eval_to_worker = tasks.run_update_eval.delay
        # The catalog command's `update` group and the admin's "Check for updates"
        # (catalog.extensions: the catalog does not import this app).
        command.register()
