"""Helpers the guard's tests share."""

from __future__ import annotations

from cluster.models import Replica
from tests.catalog.samples import store

H100 = "nvidia-h100-80gb"


def guard_model(
    name: str,
    fmt: str = "qwen3guard",
    endpoint: str | None = None,
    *,
    context_length: int | None = None,
) -> None:
    """Put a guard model in the catalog (a sim profile), with a ready replica at
    ``endpoint`` when one is given."""
    model = {
        "name": name,
        "source": f"sim/{name}",
        "role": "guard",
        "guard": {"format": fmt},
        "profiles": [{"name": "sim", "engine": "sim", "gpu_class": H100}],
        "scaling": {"min": 1, "max": 1},
    }
    if context_length is not None:
        model["context_length"] = context_length
    store(model)
    if endpoint:
        Replica.objects.create(model_name=name, state="ready", endpoint=endpoint, profile="sim")
