"""Small questions about a model, a profile or an adapter, and the values read from them.

What a model is treated as (class, on demand, guard, external, peer, simulated), what a
profile needs (CPU only or not), the defaults of a canary and an adapter, and the
parsing of owners, facility levels and Hugging Face repository pages.
"""

from __future__ import annotations

from collections.abc import Iterable

from catalog.rules.constants import (
    CLASS_CRITICAL,
    CLASS_OPPORTUNISTIC,
    CLASS_STANDARD,
    FACILITY_LEVELS,
    ROLE_GUARD,
)
from catalog.spec import Adapter, Canary, Model, Profile, Scaling

_HF_HOSTS = ("https://huggingface.co/", "http://huggingface.co/", "https://hf.co/")
_OWNER_PREFIXES = ("org:", "team:", "project:")


def cpu_capable(engine: str) -> bool:
    """Return whether an engine can serve a model without a GPU (llama.cpp only)."""
    return engine == "llamacpp"


def cpu_only(p: Profile) -> bool:
    """Return whether a profile needs no GPU: it names no class and its engine can.

    Only an engine that can serve without a card may leave the class out; otherwise an
    omitted class would quietly place a replica on a machine with nothing to run it.
    """
    return p.gpu_class == "" and cpu_capable(p.engine)


def on_demand(scaling: Scaling) -> bool:
    """Return whether a model is loaded when asked for: min 0 with a max above it.

    Min 0 and max 0 is different: configured and deliberately not running.
    """
    return scaling.min == 0 and scaling.max > 0


def is_guard(m: Model) -> bool:
    """Return whether a model judges traffic rather than serving it."""
    return m.role == ROLE_GUARD


def is_external(m: Model) -> bool:
    """Return whether a model is served by a provider outside the cluster."""
    return m.external is not None


def is_peer(m: Model) -> bool:
    """Return whether a model is offered by a federated cluster."""
    return m.external is not None and m.external.peer != ""


def effective_class(m: Model) -> str:
    """Return the class a model is treated as.

    What it says; when it says nothing, critical for a guard (every judged request
    waits on it), opportunistic for one loaded on demand (it holds capacity only while
    asked for) and standard for everything else.
    """
    if m.class_:
        return m.class_
    if is_guard(m):
        return CLASS_CRITICAL
    if on_demand(m.scaling):
        return CLASS_OPPORTUNISTIC
    return CLASS_STANDARD


def class_rank(c: str) -> int:
    """Return a class's rank: a higher rank may take capacity from a lower one."""
    if c == CLASS_CRITICAL:
        return 3
    if c in (CLASS_STANDARD, ""):
        return 2
    return 1


def valid_owner(o: str) -> bool:
    """Return whether an owner is written org:ID, team:ID or project:ID."""
    return any(o.startswith(p) and len(o) > len(p) for p in _OWNER_PREFIXES)


def parse_level(s: str) -> str:
    """Return a facility level (rack, row, room, site), trimmed and lowercased.

    Raises ValueError, naming the four, for anything else.
    """
    level = s.strip().lower()
    if level not in FACILITY_LEVELS:
        raise ValueError(f'"{s}" is not one of {", ".join(FACILITY_LEVELS)}')
    return level


def short_revision(rev: str) -> str:
    """Return a commit as a person writes it: its first eight characters."""
    return rev[:8]


def effective_scale(a: Adapter) -> float:
    """Return the scale an adapter is applied at: its own, or 1 when not above zero."""
    return a.scale if a.scale > 0 else 1.0


def kv_index(m: Model) -> bool:
    """Return whether the router routes a model by the KV cache its replicas report."""
    return any(p.kv_events for p in m.profiles)


def profile_by_name(m: Model, name: str) -> Profile | None:
    """Return a model's profile of this name, or None."""
    return next((p for p in m.profiles if p.name == name), None)


def simulated(m: Model) -> bool:
    """Return whether a model produces synthetic text: it has profiles, all of them sim.

    One real profile means a request can land on a real engine, and a model that
    sometimes answers for real must not be labelled as though it never does.
    """
    return bool(m.profiles) and all(p.engine == "sim" for p in m.profiles)


def suggest_cores(cpu_counts: Iterable[int]) -> int:
    """Return the cores to give a CPU replica on nodes of these CPU counts.

    Half of the smallest (at least 1), so two replicas share any of the nodes without
    competing; zero when no node reports, which reserves nothing.
    """
    smallest = min((c for c in cpu_counts if c > 0), default=0)
    return max(smallest // 2, 1) if smallest else 0


def canary_limits(c: Canary) -> tuple[int, float, float]:
    """Return a canary's rollback thresholds, defaults filled in (50, 0.05, 1.5).

    In order: min_requests, max_error_increase, max_ttft_ratio.
    """
    return (
        c.min_requests if c.min_requests > 0 else 50,
        c.max_error_increase if c.max_error_increase > 0 else 0.05,
        c.max_ttft_ratio if c.max_ttft_ratio > 0 else 1.5,
    )


def repository_page(source: str) -> str | None:
    """Return the repository id when source is a Hugging Face repository's page.

    A page is ``https://huggingface.co/org/repo`` or one of its tree views; a file under
    ``/resolve/`` is not one. None for anything else.
    """
    for host in _HF_HOSTS:
        if not source.startswith(host):
            continue
        parts = source[len(host) :].strip("/").split("/")
        if len(parts) < 2 or (len(parts) > 2 and parts[2] == "resolve"):
            return None
        return f"{parts[0]}/{parts[1]}"
    return None
