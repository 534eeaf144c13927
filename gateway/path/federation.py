"""Federation's pure core: a peer's name, what its ``/v1/models`` lists, the catalog
changes that follow from it, and whether the peer is up (its breaker).

Plain functions over plain data: ``gateway.peers`` reads the peer and the catalog and
writes what these decide through the catalog's services.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from catalog import spec

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
# The header a request sent to a peer carries (``gateway.path.routing``): the peer holds it to
# what a peer's key may reach, so nothing it got from a peer is passed on to another.
VIA = "x-llmgw-via"
VIA_VALUE = "llmgw-federation"
UP = "up"
TRIPPED = "tripped"


def name_problem(name: str) -> str:
    """Why ``name`` cannot name a peer ("" when it can): its models are named NAME/MODEL."""
    if not NAME_RE.match(name or ""):
        return (
            f"peer name {name!r} is not lowercase letters, digits and '-' (starting with a "
            "letter or digit, at most 63): its models are named NAME/MODEL"
        )
    return ""


def models_url(url: str) -> str:
    """The peer's ``/v1/models`` from its address, given with or without ``/v1``."""
    return base_v1(url) + "/models"


def base_v1(url: str) -> str:
    """The peer's ``/v1`` address, given with or without it."""
    base = url.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


def listed_models(body: Any) -> tuple[list[str], str]:
    """The model ids a ``/v1/models`` answer lists, and "" — or ([], why it is not one).

    An id may hold ``/`` (``org/model``); one the catalog's name rules refuse is refused
    when it is written (logged, the others still written).
    """
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return [], "its /v1/models answer has no data list"
    out: list[str] = []
    for item in data:
        ident = item.get("id") if isinstance(item, dict) else None
        if not isinstance(ident, str) or not ident.strip():
            continue
        if any(ord(c) < 0x21 or ord(c) == 0x7F for c in ident):
            continue
        if ident not in out:
            out.append(ident)
    return out, ""


def peer_model(peer: str, url: str, key_file: str, model: str) -> spec.Model:
    """The catalog's entry for ``model`` offered by ``peer``: external, named PEER/MODEL."""
    return spec.Model(
        name=f"{peer}/{model}",
        description=f"offered by the federated cluster {peer}",
        # Not weights of ours: a source no registry or mirror reads (never update-checked).
        source=f"llmgw-peer://{peer}/{model}",
        external=spec.External(url=base_v1(url), model=model, api_key_file=key_file, peer=peer),
    )


@dataclass(frozen=True)
class Plan:
    """What a refresh writes: models to add, to rewrite (the peer's url or key changed),
    and to remove (the peer stopped listing them)."""

    add: list[spec.Model] = field(default_factory=list)
    change: list[spec.Model] = field(default_factory=list)
    remove: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.add or self.change or self.remove)


def plan(peer: str, url: str, key_file: str, listed: Sequence[str],
         existing: Iterable[spec.Model]) -> Plan:  # fmt: skip
    """The changes that make the catalog's models of ``peer`` the ones it lists.

    ``existing`` is every catalog model whose ``external.peer`` is ``peer``. A name
    already taken by a model not of this peer is left alone (the catalog refuses it).
    """
    have = {m.name: m for m in existing}
    want = {f"{peer}/{m}": peer_model(peer, url, key_file, m) for m in listed}
    add = [m for n, m in want.items() if n not in have]
    change = []
    for n, m in want.items():
        old = have.get(n)
        if old is not None and old.external != m.external:
            change.append(replace(old, external=m.external))
    remove = [n for n in have if n not in want]
    return Plan(add, change, remove)


@dataclass(frozen=True)
class Thresholds:
    """When a peer trips and when it comes back (LocalAI's figures by default)."""

    errors: int = 1  # failures within ``window`` that trip it
    window: float = 30.0
    probes: int = 3  # probes passed in a row to come back
    dwell: float = 60.0  # the least time it stays tripped


@dataclass(frozen=True)
class Health:
    """A peer's breaker: up or tripped, its recent failures, its passes since tripping."""

    state: str = UP
    failures: tuple[float, ...] = ()
    since: float = 0.0  # when it tripped
    passes: int = 0


def probed(h: Health, ok: bool, now: float, t: Thresholds) -> Health:
    """The breaker after a probe at ``now`` that passed (``ok``) or failed."""
    if h.state == UP:
        if ok:
            return h
        failures = tuple(f for f in h.failures if now - f < t.window) + (now,)
        if len(failures) >= t.errors:
            return Health(TRIPPED, (), now, 0)
        return Health(UP, failures)
    if not ok:
        return replace(h, passes=0)
    passes = h.passes + 1
    if passes >= t.probes and now - h.since >= t.dwell:
        return Health()
    return replace(h, passes=passes)
