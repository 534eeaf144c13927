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
        from llmgw_core.events import Event, derive, register

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
    from catalog.models import ServedModel
    from catalog.rules import ROLE_GUARD

    judges = ServedModel.objects.filter(name__in=names, role=ROLE_GUARD)
    return list(judges.values_list("name", flat=True))
