"""Catalog data the tests share: small valid models, as a file or the API writes them."""

from __future__ import annotations

import copy
from typing import Any


def gpu_model(name: str = "chat", **extra: Any) -> dict[str, Any]:
    """Return a valid vLLM model on two H100s."""
    data: dict[str, Any] = {
        "name": name,
        "source": f"org/{name}",
        "profiles": [{"name": "h100", "engine": "vllm", "gpu_class": "nvidia-h100-80gb", "tp": 2}],
        "scaling": {"min": 1, "max": 2},
    }
    data.update(copy.deepcopy(extra))
    return data


def cpu_model(name: str = "small", **extra: Any) -> dict[str, Any]:
    """Return a valid llama.cpp model on CPUs."""
    data: dict[str, Any] = {
        "name": name,
        "source": f"/models/{name}.gguf",
        "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2}],
        "scaling": {"min": 0, "max": 1},
    }
    data.update(copy.deepcopy(extra))
    return data


def store(*models: dict[str, Any]) -> None:
    """Save models through the service, as an operator's change would."""
    from catalog import codec, services
    from catalog.choices import Surface

    for data in models:
        m, problems = codec.decode_model(data)
        assert not problems, problems
        services.save_model(m, services.Actor(user=None, surface=Surface.CLI, name="fixture"))
