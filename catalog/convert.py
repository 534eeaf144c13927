"""Move a model between the database rows and ``catalog.spec``, and locate a rule's path.

A block that has no column of its own (``external``, ``canary``, ``eval``, ``guard``,
``origin``) is present exactly when one of its columns is set: a block written with every
field empty is refused by the rules anyway (an external model needs a url, a canary a
model, an eval a suite, a guard a format), so nothing storable is lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from catalog import spec
from catalog.problems import PathPart

# Child groups: the related name on ServedModel, and the spec path of the list it holds.
CHILD_GROUPS = ("profiles", "windows", "adapters", "aliases", "origin_files")

_PROFILE_FIELDS = [
    "name", "engine", "engine_version", "gpu_class", "tp", "pp", "gpus_per_node",
    "nodes", "args", "env", "min_memory_gb", "cpu_cores", "min_disk_gb",
    "node_selector", "power_watts", "keep_within", "weight", "capacity",
    "priority", "startup_timeout", "kv_events",
]  # fmt: skip
_FLAT_BLOCKS = ("scaling", "external", "canary", "eval", "slo", "capabilities", "guard")


def _children(instance: Any, group: str) -> list[Any]:
    if instance.pk is None:
        return []
    return list(getattr(instance, group).all())


def spec_from_instance(
    instance: Any, children: dict[str, Sequence[Any]] | None = None
) -> spec.Model:
    """Return the spec of a ServedModel row, with its related rows.

    ``children`` replaces the stored rows of a group (``"profiles"`` and so on) with rows
    being edited, in order; groups not given are read from the database (or from
    ``prefetch_related``'s cache).
    """
    children = children or {}

    def rows(group: str) -> list[Any]:
        return list(children[group]) if group in children else _children(instance, group)

    i = instance
    return spec.Model(
        name=i.name,
        aliases=[a.name for a in rows("aliases")],
        description=i.description,
        source=i.source,
        profiles=[
            spec.Profile(
                **{
                    f: _copy(getattr(p, f))
                    if f in ("args", "env", "node_selector")
                    else getattr(p, f)
                    for f in _PROFILE_FIELDS
                }
            )
            for p in rows("profiles")
        ],
        scaling=_scaling(i, rows("windows")),
        class_=i.capacity_class,
        owner=i.owner,
        external=_external(i),
        adapters=[
            spec.Adapter(name=a.name, source=a.source, scale=a.scale) for a in rows("adapters")
        ],
        max_loaded_adapters=i.max_loaded_adapters,
        trust_remote_code=i.trust_remote_code,
        residency=i.residency,
        overflow=i.overflow,
        cached_token_weight=i.cached_token_weight,
        fallbacks=list(i.fallbacks or []),
        canary=_canary(i),
        eval=_eval_gate(i),
        routing_profile=i.routing_profile,
        slo=spec.SLO(ttft_p99=i.slo_ttft_p99, tpot_p99=i.slo_tpot_p99),
        context_length=i.context_length,
        max_output=i.max_output,
        capabilities=spec.Capabilities(
            tools=i.capabilities_tools,
            vision=i.capabilities_vision,
            embeddings=i.capabilities_embeddings,
            rerank=i.capabilities_rerank,
        ),
        role=i.role,
        guard=_guard(i),
        origin=_origin(i, rows("origin_files")),
    )


def _scaling(i: Any, windows: list[Any]) -> spec.Scaling:
    """Return a row's scaling block, its schedule from its window rows."""
    return spec.Scaling(
        min=i.scaling_min,
        max=i.scaling_max,
        idle_timeout=i.scaling_idle_timeout,
        schedule=[
            spec.ScaleWindow(
                days=list(w.days or []), from_=w.from_time, to=w.to_time, min=w.min, max=w.max
            )
            for w in windows
        ],
        prewarm=i.scaling_prewarm,
    )


def _external(i: Any) -> spec.External | None:
    """Return a row's external block, or None when none of its columns is set."""
    if not (i.external_url or i.external_model or i.external_api_key_file or i.external_peer):
        return None
    return spec.External(
        url=i.external_url,
        model=i.external_model,
        api_key_file=i.external_api_key_file,
        peer=i.external_peer,
    )


def _canary(i: Any) -> spec.Canary | None:
    """Return a row's canary block, or None when none of its columns is set."""
    if not (
        i.canary_model
        or i.canary_percent
        or i.canary_min_requests
        or i.canary_max_error_increase
        or i.canary_max_ttft_ratio
    ):
        return None
    return spec.Canary(
        model=i.canary_model,
        percent=i.canary_percent,
        min_requests=i.canary_min_requests,
        max_error_increase=i.canary_max_error_increase,
        max_ttft_ratio=i.canary_max_ttft_ratio,
    )


def _eval_gate(i: Any) -> spec.EvalGate | None:
    """Return a row's eval gate, or None when none of its columns is set."""
    if not (i.eval_suite or i.eval_min_score or i.eval_judge):
        return None
    return spec.EvalGate(suite=i.eval_suite, min_score=i.eval_min_score, judge=i.eval_judge)


def _guard(i: Any) -> spec.GuardModel | None:
    """Return a row's guard block, or None when none of its columns is set."""
    if not (i.guard_format or i.guard_categories):
        return None
    return spec.GuardModel(format=i.guard_format, categories=list(i.guard_categories or []))


def _origin(i: Any, file_rows: list[Any]) -> spec.Origin | None:
    """Return a row's origin block (with its previous one), or None when none is set."""
    files = [f for f in file_rows if not f.previous]
    previous_files = [f for f in file_rows if f.previous]
    previous = None
    if i.origin_previous_source or i.origin_previous_revision or previous_files:
        previous = spec.PreviousOrigin(
            source=i.origin_previous_source,
            revision=i.origin_previous_revision,
            files=[_origin_file(f) for f in previous_files],
        )
    if not (i.origin_repo or i.origin_revision or files or previous):
        return None
    return spec.Origin(
        repo=i.origin_repo,
        revision=i.origin_revision,
        files=[_origin_file(f) for f in files],
        previous=previous,
    )


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return dict(value)
    if isinstance(value, list):
        return list(value)
    return value


def _origin_file(f: Any) -> spec.OriginFile:
    return spec.OriginFile(path=f.path, sha256=f.sha256, bytes=f.bytes)


def instance_values(m: spec.Model) -> dict[str, Any]:
    """Return the ServedModel column values that hold a spec (not its related rows)."""
    ext = m.external or spec.External()
    can = m.canary or spec.Canary()
    ev = m.eval or spec.EvalGate()
    guard = m.guard or spec.GuardModel()
    origin = m.origin or spec.Origin()
    prev = origin.previous or spec.PreviousOrigin()
    return {
        "name": m.name,
        "description": m.description,
        "source": m.source,
        "scaling_min": m.scaling.min,
        "scaling_max": m.scaling.max,
        "scaling_idle_timeout": m.scaling.idle_timeout,
        "scaling_prewarm": m.scaling.prewarm,
        "capacity_class": m.class_,
        "owner": m.owner,
        "external_url": ext.url,
        "external_model": ext.model,
        "external_api_key_file": ext.api_key_file,
        "external_peer": ext.peer,
        "max_loaded_adapters": m.max_loaded_adapters,
        "trust_remote_code": m.trust_remote_code,
        "residency": m.residency,
        "overflow": m.overflow,
        "cached_token_weight": m.cached_token_weight,
        "fallbacks": list(m.fallbacks),
        "canary_model": can.model,
        "canary_percent": can.percent,
        "canary_min_requests": can.min_requests,
        "canary_max_error_increase": can.max_error_increase,
        "canary_max_ttft_ratio": can.max_ttft_ratio,
        "eval_suite": ev.suite,
        "eval_min_score": ev.min_score,
        "eval_judge": ev.judge,
        "routing_profile": m.routing_profile,
        "slo_ttft_p99": m.slo.ttft_p99,
        "slo_tpot_p99": m.slo.tpot_p99,
        "context_length": m.context_length,
        "max_output": m.max_output,
        "capabilities_tools": m.capabilities.tools,
        "capabilities_vision": m.capabilities.vision,
        "capabilities_embeddings": m.capabilities.embeddings,
        "capabilities_rerank": m.capabilities.rerank,
        "role": m.role,
        "guard_format": guard.format,
        "guard_categories": list(guard.categories),
        "origin_repo": origin.repo,
        "origin_revision": origin.revision,
        "origin_previous_source": prev.source,
        "origin_previous_revision": prev.revision,
    }


def child_values(m: spec.Model) -> dict[str, list[dict[str, Any]]]:
    """Return the related rows' values of a spec, per group, in order."""
    origin = m.origin or spec.Origin()
    prev = origin.previous or spec.PreviousOrigin()
    return {
        "profiles": [{f: _copy(getattr(p, f)) for f in _PROFILE_FIELDS} for p in m.profiles],
        "windows": [
            {
                "days": list(w.days),
                "from_time": w.from_,
                "to_time": w.to,
                "min": w.min,
                "max": w.max,
            }
            for w in m.scaling.schedule
        ],  # fmt: skip
        "adapters": [{"name": a.name, "source": a.source, "scale": a.scale} for a in m.adapters],
        "aliases": [{"name": a} for a in m.aliases],
        "origin_files": [
            {"path": f.path, "sha256": f.sha256, "bytes": f.bytes, "previous": False}
            for f in origin.files
        ]
        + [
            {"path": f.path, "sha256": f.sha256, "bytes": f.bytes, "previous": True}
            for f in prev.files
        ],
    }


@dataclass(frozen=True)
class Location:
    """Where a rule's path points in the database: a column, or a column of a child row.

    ``group`` is None for the ServedModel itself, else a related name; ``index`` is the
    row's position in that group as the user sees it (origin files count within their
    own list, previous or not); ``previous`` marks origin.previous.files.
    """

    group: str | None
    field: str | None
    index: int | None = None
    previous: bool = False


_FIELD_RENAMES = {"class": "capacity_class", "from": "from_time", "to": "to_time"}


def locate(path: Iterable[PathPart]) -> Location:
    """Return the column (and child row) a rule's path names.

    ``("profiles", 0, "tp")`` is profile 0's ``tp``; ``("scaling", "schedule", 1,
    "from")`` is window 1's ``from_time``; ``("canary", "percent")`` is
    ``canary_percent``; ``("fallbacks", 2)`` is ``fallbacks``; ``("profiles",)`` is the
    profiles as a whole (field None).
    """
    p = list(path)
    if not p:
        return Location(None, None)
    head = p[0]
    if head in ("profiles", "adapters") and len(p) >= 2 and isinstance(p[1], int):
        field = str(p[2]) if len(p) >= 3 else None
        return Location(str(head), field, p[1])
    if head in ("profiles", "adapters"):
        return Location(str(head), None)
    if head == "aliases":
        return Location("aliases", "name", p[1] if len(p) > 1 else None)  # type: ignore[arg-type]
    if head == "scaling" and len(p) >= 2 and p[1] == "schedule":
        if len(p) >= 3 and isinstance(p[2], int):
            field = _FIELD_RENAMES.get(str(p[3]), str(p[3])) if len(p) >= 4 else None
            return Location("windows", field, p[2])
        return Location("windows", None)
    if head == "origin" and len(p) >= 2 and p[1] in ("files", "previous"):
        previous = p[1] == "previous"
        rest = p[2:] if previous else p[1:]
        if rest and rest[0] == "files":
            idx = rest[1] if len(rest) > 1 and isinstance(rest[1], int) else None
            field = str(rest[2]) if len(rest) > 2 else None
            return Location("origin_files", field, idx, previous)
        if previous and rest:
            return Location(None, f"origin_previous_{rest[0]}")
        if previous:
            return Location(None, "origin_previous_source")
    if head in ("fallbacks",):
        return Location(None, "fallbacks")
    if head in _FLAT_BLOCKS or head == "origin":
        if len(p) >= 2 and isinstance(p[1], str):
            return Location(None, f"{head}_{p[1]}")
        first = {
            "scaling": "scaling_min",
            "external": "external_url",
            "canary": "canary_model",
            "eval": "eval_suite",
            "slo": "slo_ttft_p99",
            "capabilities": "capabilities_tools",
            "guard": "guard_format",
            "origin": "origin_repo",
        }
        return Location(None, first[str(head)])
    return Location(None, _FIELD_RENAMES.get(str(head), str(head)))
