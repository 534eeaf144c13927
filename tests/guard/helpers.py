"""Helpers the guard's tests share."""

from __future__ import annotations

from typing import Any

from cluster.models import Replica
from tests.catalog.samples import sim_model, store

H100 = "nvidia-h100-80gb"


def guard_model(
    name: str,
    fmt: str = "qwen3guard",
    endpoint: str | None = None,
    *,
    state: str = "ready",
    **extra: Any,
) -> Replica | None:
    """Put a guard model in the catalog (``samples.sim_model`` judging in ``fmt``), with a
    replica in ``state`` when an ``endpoint`` is given (at it when ready); ``extra`` is
    the model's other keys (``context_length``, ``slo``; None: not written). Return the
    replica."""
    given = {k: v for k, v in extra.items() if v is not None}
    store(sim_model(name, tp=None, judge=fmt, **given))
    if not endpoint:
        return None
    return Replica.objects.create(
        model_name=name, state=state, endpoint=endpoint if state == "ready" else "", profile="sim"
    )
