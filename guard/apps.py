"""The guard app: judges, the policy, the chain and their record."""

from __future__ import annotations

from django.apps import AppConfig

from catalog.rules import ROLE_GUARD
from llmgw_core.events import Event, derive, register


class GuardConfig(AppConfig):
    """Judge models judging requests and answers."""

    name = "guard"
    verbose_name = "Guard"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here: guard.signals imports models, which load with the apps, after
        # this module.
        from guard import signals  # noqa: PLC0415

        # The guard's live events (llmgw_core.events; their renderers: guard.live).
        register(
            Event("judges", "guard.judges_changed", "guard.judges", "names", str,
                  "judges' health (the list is sent whole)"),
            Event("evals", "guard.evals_changed", "guard.evals", "pks", int,
                  "evaluations: results as they are written, the run's end"),
        )  # fmt: skip
        # A judge's replicas are part of its health (ready or not): a model marked changed
        # that is a judge marks the judge.
        derive("models", "judges", _judges_among)
        signals.connect()


def _judges_among(names: set[str]) -> list[str]:
    """Return which of these models are judges."""
    # Imported here: models load with the apps, after this module.
    from catalog.models import ServedModel  # noqa: PLC0415

    judges = ServedModel.objects.filter(name__in=names, role=ROLE_GUARD)
    return list(judges.values_list("name", flat=True))
