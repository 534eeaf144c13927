"""What a gateway process routes by: plain data built from the catalog, the ready
replicas and the client keys, with no Django and no I/O. ``build`` makes a ``Table``;
the state (``gateway.records.state``) builds a new one when something changed and swaps it in
whole, so a request reads one consistent table without a lock.

Names share one namespace, as the catalog's rules hold: a model, an alias or an adapter
resolves to one entry. Guard models are never listed and never resolved for a client.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from catalog import rules, spec
from gateway.path import balance, sizing

ROLE_GUARD = "guard"
# A client key's secret starts with it (``gateway.models.new_secret`` makes them).
KEY_PREFIX = "llmgw-ck-"


def digest(secret: str) -> str:
    """Return a client key as the table holds it and ``gateway.models.ClientKey`` stores
    it: its SHA-256, hex (a plain hash suffices for 32 random bytes, and checking one
    stays cheap on every request)."""
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class ReplicaRow:
    """A ready replica as the cluster has it (what ``gateway.records.state`` reads)."""

    id: int
    model: str
    profile: str
    endpoint: str
    # On a cordoned node (draining): used only when the model has no other ready replica,
    # so a drain that replaces it first leaves no gap and then takes its traffic away.
    draining: bool = False


@dataclass(frozen=True)
class Key:
    """A client key as the gateway checks it (its secret is stored only as a digest)."""

    id: int
    name: str
    owner: str
    models: tuple[str, ...]
    expires: float | None  # a Unix time
    rpm: int = 0
    tpm: int = 0
    priority: str = "normal"  # its admission band (gateway.path.admission)
    owner_tpm: int = 0  # its owner's token budget a minute, shared by its keys (0: none)
    # The one replica its requests go to (the control plane's key for the capacity
    # bench, ``ClientKey.replica``): no other, no canary, no fallback (gateway.path.routing).
    replica: int | None = None
    # Another llmgw cluster's (its owner peer:NAME), or a request that came through one
    # (``x-llmgw-via``): never a residency: local model nor one learned from a peer, on
    # any hop (docs/federation.md).
    peer: bool = False
    # A batch's line (gateway.batch.token): "idle" (load scaling leaves it out: it runs on
    # the replicas there are) or "scale" (counted as load); "" for every other request.
    batch: str = ""

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires

    def may_name(self, entry: Entry) -> bool:
        """Whether this key may use ``entry``: listed, or any cluster model by default.

        External models only when listed by name: their prompts leave the cluster.
        """
        if entry.guard or (self.peer and not crosses(entry.model)):
            return False
        if self.models:
            return entry.model.name in self.models or entry.name in self.models
        return entry.model.external is None

    def may_reach(self, model: spec.Model) -> bool:
        """Whether a request of this key may be served by ``model`` on a hop the client did
        not name (a canary, a fallback): within the same scope as ``may_name``.

        Never a judge; with a list, only a model it lists by its name or an alias; without
        one, cluster models only (a fallback must not carry a prompt out of the cluster
        for a key that could not send it there itself).
        """
        if model.role == ROLE_GUARD or (self.peer and not crosses(model)):
            return False
        if self.models:
            return model.name in self.models or any(a in self.models for a in model.aliases)
        return model.external is None


def crosses(model: spec.Model) -> bool:
    """Whether ``model`` may be offered to another llmgw cluster: not residency: local,
    and not learned from a peer (nothing is passed on from one peer to another)."""
    if model.residency == rules.RESIDENCY_LOCAL:
        return False
    return model.external is None or not model.external.peer


@dataclass(frozen=True)
class Entry:
    """What a name a client sends resolves to."""

    name: str  # the name as the client sent it (model, alias or adapter)
    model: spec.Model
    adapter: str | None = None

    @property
    def guard(self) -> bool:
        return self.model.role == ROLE_GUARD


@dataclass
class Pool:
    """A model's ready replicas and the ring over them."""

    targets: tuple[balance.Target, ...]
    endpoints: dict[int, str]
    ring: balance.Ring
    context: int  # the context one request really gets (the smallest of its replicas')
    context_why: str = ""
    engines: dict[int, str] = field(default_factory=dict)  # replica id -> its engine


@dataclass
class Table:
    models: dict[str, spec.Model] = field(default_factory=dict)
    names: dict[str, Entry] = field(default_factory=dict)
    pools: dict[str, Pool] = field(default_factory=dict)
    keys: dict[str, Key] = field(default_factory=dict)  # by digest
    # Models with no ready replica whose wanted ones placement could not put anywhere,
    # and why (for the operator's log: a client is told only that there is no room).
    unplaced: dict[str, str] = field(default_factory=dict)
    # When each model was added to the catalog (Unix seconds), for /v1/models.
    added: dict[str, int] = field(default_factory=dict)
    # Federated peers whose breaker is open, and why (docs/federation.md): their models
    # are not listed and a request for one is refused at once.
    down: dict[str, str] = field(default_factory=dict)
    built: float = field(default_factory=time.monotonic)
    created: int = field(default_factory=lambda: int(time.time()))

    def resolve(self, name: str) -> Entry | None:
        return self.names.get(name)

    def pool(self, model: str) -> Pool | None:
        return self.pools.get(model)

    def model_named(self, name: str) -> str | None:
        """The model a reference in the catalog (a fallback, a canary) means: a model's
        name or an alias of it; None for anything else."""
        entry = self.names.get(name)
        return entry.model.name if entry is not None and entry.adapter is None else None

    def listed(self, key: Key, now: datetime) -> list[Entry]:
        """What ``GET /v1/models`` shows this key: every name it may use, in catalog order,
        but for a model switched off (``switched_off``) that has no ready replica left and
        a model of a federated peer that is down."""
        return [
            e for e in self.names.values()
            if key.may_name(e) and not (e.model.name not in self.pools
                                        and switched_off(e.model, now))
            and not self.peer_down(e.model)
        ]  # fmt: skip

    def peer_down(self, model: spec.Model) -> str | None:
        """The peer offering ``model`` when that peer is down, else None."""
        peer = model.external.peer if model.external is not None else ""
        return peer if peer and peer in self.down else None


def switched_off(m: spec.Model, now: datetime) -> str:
    """Why no replica of the cluster model ``m`` may run at ``now`` ('' when one may):
    min 0 and max 0 (the admin's "Switch off"), or a schedule window in force that says
    so. Nothing wakes such a model, so a request for it is answered at once rather than
    held for a replica that will not come. ``now`` is aware, in the control time zone (as
    ``cluster.plan.bounds`` reads the windows). External models are never switched off."""
    if m.external is not None:
        return ""
    lo, hi, where = m.scaling.min, m.scaling.max, "its scaling"
    if m.scaling.schedule:
        window = rules.window_at(m.scaling, now)
        if window is not None:
            lo, hi = window.min, max(window.max or hi, window.min)
            where = f"its schedule window {','.join(window.days) or 'every day'} " \
                    f"{window.from_}-{window.to}"  # fmt: skip
    if lo or hi:
        return ""
    return f"switched off ({where}: min 0, max 0)"


def _weights(m: spec.Model) -> dict[str, float]:
    return {p.name: p.weight for p in m.profiles}


def _args(m: spec.Model) -> dict[str, list[str]]:
    return {p.name: list(p.args) for p in m.profiles}


def _engines(m: spec.Model) -> dict[str, str]:
    return {p.name: p.engine for p in m.profiles}


def build(
    models: Sequence[spec.Model],
    replicas: Iterable[ReplicaRow],
    keys: Mapping[str, Key],
    unplaced: Mapping[str, str] | None = None,
    added: Mapping[str, int] | None = None,
    down: Mapping[str, str] | None = None,
) -> Table:
    table = Table(keys=dict(keys), added=dict(added or {}), down=dict(down or {}))
    for m in models:
        table.models[m.name] = m
        if m.role == ROLE_GUARD:
            continue
        table.names[m.name] = Entry(m.name, m)
        for alias in m.aliases:
            table.names.setdefault(alias, Entry(alias, m))
        for adapter in m.adapters:
            table.names.setdefault(adapter.name, Entry(adapter.name, m, adapter.name))
    by_model: dict[str, list[ReplicaRow]] = {}
    for row in replicas:
        if row.endpoint and row.model in table.models:
            by_model.setdefault(row.model, []).append(row)
    for name, rows in by_model.items():
        m = table.models[name]
        staying = [r for r in rows if not r.draining]
        rows = staying or rows
        weights = _weights(m)
        args = _args(m)
        engines = _engines(m)
        targets = tuple(balance.Target(r.id, weights.get(r.profile, 0.0)) for r in rows)
        context, why = m.context_length, ""
        for r in rows:
            ctx, reason = sizing.effective_context(
                m.context_length, args.get(r.profile, []), engines.get(r.profile, "")
            )
            if reason and (not context or ctx < context):
                context, why = ctx, reason
        table.pools[name] = Pool(
            targets=targets,
            endpoints={r.id: r.endpoint.rstrip("/") for r in rows},
            ring=balance.Ring(targets),
            context=context,
            context_why=why,
            engines={r.id: engines.get(r.profile, "") for r in rows},
        )
    table.unplaced = {
        name: why for name, why in (unplaced or {}).items()
        if name in table.models and name not in table.pools
    }  # fmt: skip
    return table


class Source(Protocol):
    """Where the path reads its table: ``gateway.records.state.State``, which reads the
    database on its own thread and swaps a new ``Table`` in whole."""

    table: Table
    loaded: bool

    def start(self, loop: Any = None) -> None: ...
    async def listen(self) -> None: ...
    async def first_load(self, timeout: float = 30.0) -> bool: ...
    async def next_pass(self, timeout: float) -> None: ...
    async def wait_for_pool(self, model: str, timeout: float) -> bool: ...
    def demand(self, model: str, now: float | None = None) -> None: ...
    @property
    def stale(self) -> bool: ...
    def age(self) -> float | None: ...
