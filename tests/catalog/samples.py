"""Catalog data the tests share: small valid models, as a file or the API writes them."""

from __future__ import annotations

import copy
from typing import Any

H100 = "nvidia-h100-80gb"


def all_day(least: int, most: int) -> list[dict[str, Any]]:
    """A schedule in force whenever a test runs: two windows, the two halves of the day
    back to back, each from ``least`` to ``most`` replicas."""
    return [
        {"from": "00:00", "to": "12:00", "min": least, "max": most},
        {"from": "12:00", "to": "00:00", "min": least, "max": most},
    ]


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


def sim_profile(
    name: str = "sim", *, gpu_class: str = H100, tp: int | None = 1, **keys: Any
) -> dict[str, Any]:
    """Return one profile of the sim engine, ``name``: ``tp`` cards (None: not written)
    of ``gpu_class``, with ``keys`` over it (env, args, capacity, priority, weight)."""
    data: dict[str, Any] = {"name": name, "engine": "sim", "gpu_class": gpu_class}
    if tp is not None:
        data["tp"] = tp
    data.update(copy.deepcopy(keys))
    return data


def sim_model(
    name: str,
    replicas: int = 1,
    *,
    most: int | None = None,
    gpu_class: str = H100,
    tp: int | None = 1,
    profile: dict[str, Any] | None = None,
    schedule: list[dict[str, Any]] | None = None,
    judge: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """Return a valid model the sim engine serves, the one the tests that run sims build.

    One profile, ``sim``, of ``tp`` cards (None: not written) of ``gpu_class``, with
    ``profile``'s keys over it (env, args, capacity, priority); scaling from ``replicas``
    to ``most`` (unset: as many, at least 1), with ``schedule``'s windows (``all_day``);
    a judge of the guard in ``judge``'s format (``qwen3guard``, ``llama-guard``, ...)
    when given. ``extra`` is the model's other keys, each replacing what is here (a
    ``scaling`` whole; ``profiles``, a list of ``sim_profile``).
    """
    sim = sim_profile(gpu_class=gpu_class, tp=tp)
    sim.update(copy.deepcopy(profile or {}))
    data: dict[str, Any] = {
        "name": name,
        "source": f"sim/{name}",
        "profiles": [sim],
        "scaling": {"min": replicas, "max": max(1, replicas) if most is None else most},
    }
    if schedule is not None:
        data["scaling"]["schedule"] = copy.deepcopy(schedule)
    if judge is not None:
        data["role"] = "guard"
        data["guard"] = {"format": judge}
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
