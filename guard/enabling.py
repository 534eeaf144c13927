"""Enable a known judge as an operator asks, from the console or the API: one code path.

Checks the request (a known name; served on CPUs, the roomiest GPU class or the sim
engine), adds the judge to the catalog (``services.enable_judge``) and, when asked,
appends it to the policy's judges (``services.use_judges``). Returns what was done in
lines a person reads; refuses with the problems by field, having changed nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from catalog import services as catalog_services
from catalog.models import ServedModel
from guard import known, services
from llmgw_core.refused import Refused

WHERE_CPU, WHERE_GPU, WHERE_SIM = "cpu", "gpu", "sim"
WHERES = (WHERE_CPU, WHERE_GPU, WHERE_SIM)


class EnableRefused(Refused):
    """The request cannot be carried out; ``errors`` by field (name, where, policy)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


@dataclass
class Enabled:
    judge: str
    changed: bool
    where: str
    lines: list[str] = field(default_factory=list)
    policy: list[str] = field(default_factory=list)


def check_request(name: str, where: str) -> dict[str, list[str]]:
    """Return the problems of an enable request by field (empty when it can be tried)."""
    errors: dict[str, list[str]] = {}
    if name not in known.KNOWN:
        errors["name"] = [f'no known judge "{name}": pick one of {", ".join(known.KNOWN)}']
    if where not in WHERES:
        errors["where"] = [f'"{where}" is not one of {", ".join(WHERES)}']
    return errors


def where_text(name: str) -> str:
    """Return where an enabled judge is served, in a few words."""
    model = ServedModel.objects.filter(name=name).first()
    profiles = model.to_spec().profiles if model is not None else []
    if not profiles:
        return ""
    profile = profiles[0]
    if profile.engine == "sim":
        return f"on the sim engine (simulated, class {profile.gpu_class})"
    if profile.gpu_class:
        return f"on {profile.gpu_class} (vLLM, the roomiest GPU class)"
    return f"on CPUs (llama.cpp, {profile.cpu_cores} cores reserved)"


def enable(name: str, where: str, *, add_to_policy: bool, user: Any, surface: str) -> Enabled:
    """Enable ``name`` served ``where``; raise EnableRefused when it cannot be."""
    errors = check_request(name, where)
    if errors:
        raise EnableRefused(errors)
    actor = catalog_services.Actor(user=user, surface=surface)
    try:
        enabled, changed = services.enable_judge(
            name, gpu=where == WHERE_GPU, sim=where == WHERE_SIM, actor=actor
        )
    except ValueError as exc:
        raise EnableRefused({"where": [str(exc)]}) from exc
    except catalog_services.Refused as exc:
        raise EnableRefused({"name": [p.line() for p in exc.problems]}) from exc
    lines = [
        f"{enabled}: enabled {where_text(enabled)}".rstrip()
        if changed
        else f"{enabled}: already enabled as asked"
    ]
    policy = services.current_policy()
    order = list(policy.judge_models)
    if add_to_policy and enabled not in order:
        order = [*order, enabled]
        try:
            replaced = services.use_judges(order, user=user, surface=surface)
        except (ValueError, services.PolicyRefused) as exc:
            lines.append(f"not added to the policy: {exc}")
            order = list(policy.judge_models)
        else:
            lines.append(f"added to the policy's judges as #{len(order)}")
            lines += replaced
    return Enabled(enabled, changed, where, lines, order)
