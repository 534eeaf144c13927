"""The reconciler: each tick, bring the cluster's replicas toward what the catalog wants.

One leader at a time (a PostgreSQL advisory lock, ``llmgw_core.advisory``; in the
embedded one-process mode a lock of the process). Steps, each over the database's current
state so a tick can be repeated:

1. nodes silent past ``LLMGW_NODE_LOST_AFTER`` are lost and their replicas re-placed,
   unless most nodes fell silent at once: then they are held, not ready with their
   replicas kept (``cluster.silence.judge``);
2. each model's wanted count is met by creating or stopping replicas: between the min
   and max in force (``cluster.plan.bounds``: the schedule window in force in
   ``LLMGW_TIMEZONE`` opened early by prewarm, demand for on-demand models with their
   idle timeout or ``LLMGW_IDLE_TIMEOUT``), on the load the gateway processes report
   (``cluster.load``; ``cluster.scaling`` decides, ``LLMGW_SCALE_UP_AFTER`` and
   ``LLMGW_SCALE_DOWN_AFTER`` its windows; ``ModelScale`` keeps what it decided);
   a ready replica stopped here drains first (``services.stop_replicas``): off the
   gateways' tables at once, its engine stopped ``LLMGW_STOP_DRAIN`` seconds later;
3. a rolling update's (or a drained node's) old replica stops once its replacement is
   ready, draining first as above;
4. replicas without a node are placed (``cluster.placement.place``); evictions of lower
   classes are applied; what cannot be placed says why.
"""

from __future__ import annotations

import logging
import threading
import time
import zoneinfo
from collections import defaultdict
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Q
from django.utils import timezone

from catalog import rules
from catalog.durations import SECOND
from catalog.models import ChangeRecord, ServedModel
from catalog.services import CHILD_MODELS, stored_specs
from cluster import load, marks, placement, plan, replace, scaling, services, silence, tenancy, wake
from cluster.choices import NodeHealth, ReplicaState
from cluster.desired import release, release_assignments, update_rows
from cluster.models import Assignment, ModelDemand, ModelScale, Node, Replica
from cluster.signals import reconcile_tick
from llmgw_core import advisory, events

log = logging.getLogger(__name__)

# When each model's scaling reason was last pushed to the consoles (Unix seconds, the
# tick's clock): figures alone go at most every ``scaling.FIGURES_EVERY`` seconds.
_pushed: dict[str, float] = {}

# The advisory lock's key (``llmgw_core.advisory``): any fixed 64-bit number no other
# code uses.
LEADER_LOCK = 0x6C6C6D6777  # "llmgw"


@dataclass
class TickResult:
    """What one tick did, for logs, tests and the console."""

    leader: bool = True
    lost: list[str] = field(default_factory=list)
    created: dict[str, int] = field(default_factory=dict)
    stopped: list[int] = field(default_factory=list)
    placed: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    unplaced: dict[int, str] = field(default_factory=dict)


def leadership() -> AbstractContextManager[bool]:
    """Hold the leader lock for a tick; yield whether this process got it."""
    return advisory.held(LEADER_LOCK)


def control_now() -> datetime:
    """Return now in the control time zone (``LLMGW_TIMEZONE``)."""
    return timezone.now().astimezone(zoneinfo.ZoneInfo(settings.TIME_ZONE))


def tick(now: datetime | None = None) -> TickResult:
    """Run one reconcile tick if this process is the leader."""
    now = now or control_now()
    with leadership() as leader:
        if not leader:
            return TickResult(leader=False)
        result = TickResult()
        with transaction.atomic():
            _mark_lost(now, result)
        # The layers above act first, so this tick serves what they add to the catalog
        # (the guard: a known judge its policy names, guard.signals).
        reconcile_tick.send(sender=tick, now=now)
        # The catalog is read once a tick; both steps work from the same view of it.
        specs = catalog_specs()
        with transaction.atomic():
            services.end_drains(now)
            wants = _scale(now, specs, result)
            _finish_rolls(result, now)
        with transaction.atomic():
            _place(wants, specs, result)
            _no_room(result)
        marks.ticked(_ticker or marks.who("reconciler"))
        return result


@dataclass
class _Catalog:
    """The stored catalog as the reconciler reads it, for one fingerprint of its rows."""

    version: tuple[Any, ...]
    specs: dict[str, Any]
    # Each model's profiles in placement's view, converted when first asked for.
    profiles: dict[str, tuple[placement.PlacementProfile, ...]] = field(default_factory=dict)


_catalog: _Catalog | None = None


def catalog_version() -> tuple[Any, ...] | None:
    """Return a fingerprint of every stored catalog row, or None where none is taken.

    On PostgreSQL, one query: an md5 of each catalog table's rows as text, in id order,
    so any change to a model or its profiles, windows, adapters, aliases or origin files
    (however written) changes it. Elsewhere (the embedded mode's SQLite) None: the
    catalog is read afresh each tick.
    """
    if connection.vendor != "postgresql":
        return None
    tables = [ServedModel._meta.db_table, *(m._meta.db_table for m in CHILD_MODELS.values())]
    sql = "SELECT " + ", ".join(
        f"(SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t.id), '')) "
        f"FROM {connection.ops.quote_name(table)} t)"
        for table in tables
    )
    with connection.cursor() as cur:
        cur.execute(sql)
        return tuple(cur.fetchone())


def catalog_specs() -> dict[str, Any]:
    """Return the stored catalog's models by name, normalized, in catalog order.

    Converting 2,000 models' rows to specs and normalizing them takes most of half a
    second; a tick whose catalog is unchanged (``catalog_version``) reuses the last
    tick's, and the placement profiles converted from them. The specs are read, never
    changed, by a tick.
    """
    global _catalog
    version = catalog_version()
    kept = _catalog
    if version is not None and kept is not None and kept.version == version:
        return dict(kept.specs)
    # Read after the fingerprint: a change between the two is newer than the
    # fingerprint, which the next tick sees differ.
    specs = {m.name: rules.normalize(m) for m in stored_specs()}
    _catalog = _Catalog(version, specs) if version is not None else None
    return dict(specs)


def profiles_of(m: Any) -> tuple[placement.PlacementProfile, ...]:
    """Return a catalog model's profiles in placement's view (kept with the catalog's
    specs while they are the ones ``catalog_specs`` gave)."""
    kept = _catalog
    if kept is None or kept.specs.get(m.name) is not m:
        return tuple(placement.profiles_from_spec(m))
    found = kept.profiles.get(m.name)
    if found is None:
        found = kept.profiles[m.name] = tuple(placement.profiles_from_spec(m))
    return found


# When this process started reconciling for real (run_forever, or a worker's first task);
# None for ticks driven by hand (tests with a frozen clock). See cluster.silence.
_listening_since: datetime | None = None
# Which process ticks, as the tick's mark names it (cluster.marks).
_ticker = ""


def start_listening(at: datetime | None = None, role: str = "web process") -> None:
    """Note that this process reconciles from now: nodes get a full grace period."""
    global _listening_since, _ticker
    if _listening_since is None:
        _listening_since = at or timezone.now()
        _ticker = marks.who(role)


def _mark_lost(now: datetime, result: TickResult) -> None:
    lost_after = float(settings.LLMGW_NODE_LOST_AFTER)
    candidates = Node.objects.exclude(health=NodeHealth.LOST).values_list("name", "last_heartbeat")
    # Silence counts from when heartbeats could be heard: this process's start, or the
    # latest web process's, whichever is later.
    heard = [t for t in (_listening_since, marks.heard_since()) if t is not None]
    verdict = silence.judge(list(candidates), now, lost_after, max(heard, default=None))
    for node in Node.objects.filter(
        name__in=verdict.held, health=NodeHealth.READY
    ).select_for_update():
        node.health = NodeHealth.NOT_READY
        node.reason = verdict.why
        node.save(update_fields=["health", "reason"])
        events.changed(nodes=[node.pk])
        result.held.append(node.name)
    names = verdict.lost
    for node in Node.objects.filter(name__in=names).select_for_update():
        node.health = NodeHealth.LOST
        node.reason = f"not heard from for more than {lost_after:g} s"
        node.save(update_fields=["health", "reason"])
        held = list(Assignment.objects.filter(node=node))
        # Every rank of a multi-node replica goes: one lost rank breaks the replica.
        whole = list(Assignment.objects.filter(replica_id__in={a.replica_id for a in held}))
        release_assignments(whole, f"node {node.name} lost: placing it elsewhere")
        services.bump_desired(a.node_id for a in whole)
        result.lost.append(node.name)


def _scale(now: datetime, specs: dict[str, Any], result: TickResult) -> dict[str, plan.Want]:
    idle_default = int(float(settings.LLMGW_IDLE_TIMEOUT) * SECOND)
    demands = dict(ModelDemand.objects.values_list("model_name", "last_demand"))
    replicas = _replicas_with_placement()
    wants = _wants(now, specs, demands, idle_default, replicas)
    views = _views(specs, replicas)
    changes = plan.scale(wants, views)
    served = dict(ServedModel.objects.values_list("name", "pk"))
    # Every model's new replicas in one insert (a first tick of 2,000 models made 2,000).
    Replica.objects.bulk_create(
        Replica(model_id=served[name], model_name=name, reason="waiting to be placed")
        for name, count in changes.create.items()
        for _ in range(count)
    )
    if changes.create:
        events.changed(models=list(changes.create))
    result.created.update(changes.create)
    if changes.stop:
        by_reason: dict[str, list[int]] = defaultdict(list)
        for rid, reason in changes.stop:
            by_reason[reason].append(rid)
        drain_s = float(settings.LLMGW_STOP_DRAIN)
        for reason, ids in by_reason.items():
            # Off the gateways' tables first; the engine stops once its requests are done.
            services.stop_replicas(ids, reason, drain_s, now)
        result.stopped.extend(rid for rid, _ in changes.stop)
    return wants


def _wants(
    now: datetime,
    specs: dict[str, Any],
    demands: dict[str, datetime],
    idle_default: int,
    replicas: list[replace.ReplicaRow],
) -> dict[str, plan.Want]:
    """Each model's count: fixed by its bounds, or load scaling's pick between them."""
    bounds = {name: plan.bounds(m, now, demands.get(name), idle_default)
              for name, m in specs.items()}  # fmt: skip
    kept = {s.model_name: s for s in ModelScale.objects.all()}
    wants = {name: b.fixed for name, b in bounds.items() if b.fixed is not None}
    scaled = [name for name, b in bounds.items() if b.fixed is None]
    _forget_unscaled(kept, scaled, specs)
    if not scaled:
        return wants
    try:
        loads = load.read()
        unavailable = ""
    except load.Unavailable as error:
        loads, unavailable = {}, str(error)
    running, ready = _ready_profiles(replicas)
    up_after = float(settings.LLMGW_SCALE_UP_AFTER)
    down_after = float(settings.LLMGW_SCALE_DOWN_AFTER)
    for name in scaled:
        m, b = specs[name], bounds[name]
        row = kept.get(name) or ModelScale(model_name=name)
        if unavailable:
            decision = _hold(row, b, unavailable)
        else:
            capacity, _ = scaling.capacity_of(
                [(p.name, p.engine, getattr(p, "capacity", 0)) for p in m.profiles],
                running.get(name, ()),
            )
            memory = scaling.Memory(row.target, row.over_since, row.quiet_since, row.reason,
                                    None if row.pk is None else row.lo)  # fmt: skip
            decision = scaling.decide(
                memory, loads.get(name, scaling.Load()), lo=b.lo, hi=b.hi,
                ready=ready.get(name, 0), capacity=capacity,
                slo_ttft_ms=m.slo.ttft_p99 / 1e6, now=now.timestamp(),
                up_after=up_after, down_after=down_after,
            )  # fmt: skip
        reason = decision.reason
        if b.where.startswith("on demand"):
            # Not how long ago it was asked for: that would change (and push) every tick.
            reason = f"on demand: {reason}"
        if decision.step:
            log.info("%s %s: %s", name, decision.step, reason)
            # In the actions log (who: load scaling) and marked on the model's charts.
            services.log_action(None, f"scaled {decision.step}", f"model {name}", reason,
                                via="load scaling")  # fmt: skip
        _keep_scale(row, b, decision.memory, reason, now)
        wants[name] = plan.Want(decision.target, reason)
    return wants


def _forget_unscaled(kept: dict[str, ModelScale], scaled: list[str], specs: dict[str, Any]) -> None:
    """Drop the kept scaling of models no longer scaled on load (fixed again, or gone):
    their windows start afresh when they scale next."""
    gone = [n for n in kept if n not in scaled]
    if gone:
        ModelScale.objects.filter(model_name__in=gone).delete()
        events.changed(models=[n for n in gone if n in specs])


def _ready_profiles(
    replicas: list[replace.ReplicaRow],
) -> tuple[dict[str, list[str]], dict[str, int]]:
    """Return each model's ready replicas' profiles, and how many are ready."""
    running: dict[str, list[str]] = defaultdict(list)
    ready: dict[str, int] = defaultdict(int)
    for r in replicas:
        if r.desired and r.state == ReplicaState.READY:
            running[r.model_name].append(r.profile)
            ready[r.model_name] += 1
    return running, ready


def _hold(row: ModelScale, b: plan.Bounds, unavailable: str) -> scaling.Decision:
    """Without load figures a model holds at its last target, within its bounds."""
    target = b.lo if row.target is None else min(max(row.target, b.lo), b.hi)
    reason = f"holding at {target}: no load figures ({unavailable})"
    return scaling.Decision(target, scaling.Memory(target, None, None, reason), reason)


def _keep_scale(
    row: ModelScale, b: plan.Bounds, new: scaling.Memory, reason: str, now: datetime
) -> None:
    """Save a model's scaling when it changed; push it to the consoles when worth it
    (``scaling.worth_pushing``)."""
    if (row.pk is None or row.target != new.target or row.reason != reason
            or (row.lo, row.hi) != (b.lo, b.hi) or row.over_since != new.over_since
            or row.quiet_since != new.quiet_since):  # fmt: skip
        at = now.timestamp()
        pushed = scaling.worth_pushing(
            None if row.pk is None else (row.target, row.reason),
            (new.target, reason),
            _pushed.get(row.model_name),
            at,
        )
        row.target, row.over_since, row.quiet_since = (
            new.target,
            new.over_since,
            new.quiet_since,
        )
        row.lo, row.hi, row.reason = b.lo, b.hi, reason
        row.save()
        if pushed:
            _pushed[row.model_name] = at
            events.changed(models=[row.model_name])


def _no_room(result: TickResult) -> None:
    """A model scaled up past its min whose new replica found no room says so (and
    stops saying it once none is left without room)."""
    names: dict[str, str] = {}
    if result.unplaced:
        for rid, name in sorted(
            Replica.objects.filter(
                pk__in=list(result.unplaced), unplaced=True, desired=True
            ).values_list("pk", "model_name")
        ):
            names.setdefault(name, result.unplaced[rid])
    for row in ModelScale.objects.filter(Q(model_name__in=list(names)) | ~Q(no_room="")):
        why = names.get(row.model_name)
        text = ""
        if why is not None and row.target is not None and row.target > row.lo:
            text = f"no room: scaled up to {row.target}, a replica waits: {why}"
        if row.no_room != text:
            row.no_room = text
            row.save(update_fields=["no_room", "changed"])
            events.changed(models=[row.model_name])


def _views(specs: dict[str, Any], replicas: list[replace.ReplicaRow]) -> list[plan.ReplicaView]:
    """Return the replicas as the plan sees them (``has_assignment`` set on each)."""
    prints = {name: {p.name: rules.fingerprint(p) for p in m.profiles} for name, m in specs.items()}
    return [
        plan.ReplicaView(
            id=r.pk,
            model=r.model_name,
            desired=r.desired,
            state=r.state,
            placed=r.has_assignment,
            replaces=r.replaces_id,
            created=r.created.timestamp(),
            outdated=services.outdated(r, prints.get(r.model_name, {})),
        )  # fmt: skip
        for r in replicas
    ]


def _replicas_with_placement() -> list[replace.ReplicaRow]:
    """Every replica, whether it is on a node (``has_assignment``): two queries."""
    return replace.replica_rows()


def _finish_rolls(result: TickResult, now: datetime | None = None) -> None:
    """Stop each replaced replica whose replacement is ready (cluster.plan.finish_rolls)."""
    done = list(
        Replica.objects.filter(replaces__isnull=False, state=ReplicaState.READY, desired=True)
    )
    if not done:
        return
    views = [
        plan.ReplicaView(r.pk, r.model_name, r.desired, r.state, True, r.replaces_id)
        for r in Replica.objects.filter(pk__in={r.replaces_id for r in done} | {r.pk for r in done})
    ]
    drain_s = float(settings.LLMGW_STOP_DRAIN)
    for old, new in plan.finish_rolls(views):
        # Off the gateways' tables first; its engine stops once its requests are done.
        services.stop_replicas([old], _replaced_why(old, new), drain_s, now)
        result.stopped.append(old)
    Replica.objects.filter(pk__in=[r.pk for r in done]).update(replaces=None)
    events.changed(models=[r.model_name for r in done])


def _replaced_why(old: int, new: int) -> str:
    """Say why a replaced replica stops: a rolling update's, a drain's, a roll to new
    weights (an update's promote or rollback) or a move's."""
    replicas = {r.pk: r for r in Replica.objects.filter(pk__in=(old, new))}
    if (
        old in replicas
        and new in replicas
        and replicas[old].fingerprint != replicas[new].fingerprint
    ):
        return f"replaced by #{new} (rolling update)"
    cordoned = sorted(
        Assignment.objects.filter(replica_id=old, node__cordoned=True).values_list(
            "node__name", flat=True
        )
    )
    if cordoned:
        return f"replaced by #{new} on another node ({', '.join(cordoned)} drained)"
    if old in replicas and new in replicas:
        revision = _new_weights(replicas[old], replicas[new])
        if revision is not None:
            return f"replaced by #{new} (rolled to new weights{revision})"
    return f"replaced by #{new} (moved to make room)"


def _new_weights(old: Replica, new: Replica) -> str | None:
    """Return ", at <commit>" (or "") when the model's weights revision (its origin's)
    changed between the two replicas' starts: an update's promote or rollback, which rolls
    every replica with the profile unchanged (``services.roll(every=True)``); else None."""
    records = ChangeRecord.objects.filter(
        model_name=old.model_name, at__gte=old.created, at__lte=new.created
    ).order_by("-at")
    for rec in records[:20]:
        was, now = _origin_revision(rec.before), _origin_revision(rec.after)
        if was != now:
            return f", at {now[:8]}" if now else ""
    return None


def _origin_revision(spec_json: Any) -> str:
    origin = spec_json.get("origin") if isinstance(spec_json, dict) else None
    return str(origin.get("revision") or "") if isinstance(origin, dict) else ""


def _place(wants: dict[str, plan.Want], specs: dict[str, Any], result: TickResult) -> None:
    # Nothing waits to be placed (a settled cluster's tick): the cluster is not read.
    if not Replica.objects.filter(desired=True, assignments__isnull=True).exists():
        return
    snap = replace.snapshot(specs)
    profiles: dict[str, tuple[placement.PlacementProfile, ...]] = {}
    requests = _requests(specs, snap.replicas, profiles)
    if not requests:
        return
    result_plan, waiting = _plan_placement(specs, snap, requests, profiles)
    bumped = _evict(result_plan, result)
    bumped |= _assign(specs, snap, result_plan, result)
    reasons = {int(u.key): u.told for u in result_plan.unplaced} | waiting
    reasons.update(_make_room(wants, specs, snap, result_plan, result))
    # No room anywhere: not waiting for an eviction's replacement or a roll's turn.
    no_room = (
        {int(u.key) for u in result_plan.unplaced}
        - set(waiting)
        - {rid for rid, reason in reasons.items() if reason.startswith(plan.ONE_AT_A_TIME)}
    )
    _write_reasons(reasons, no_room)
    result.unplaced.update(reasons)
    services.bump_desired(bumped)


def _write_reasons(reasons: dict[int, str], no_room: set[int]) -> None:
    """Write each waiting replica's reason, pending, in two queries however many wait:
    the rows read (locked), and one update of those whose reason or state changed (most
    ticks repeat them), which are pushed to the consoles."""
    if not reasons:
        return
    rows = Replica.objects.filter(pk__in=list(reasons)).select_for_update().order_by("pk")
    changed = []
    for r in rows.only("pk", "reason", "state", "unplaced"):
        reason = reasons[r.pk]
        if r.reason == reason and r.state == ReplicaState.PENDING:
            continue
        r.reason, r.state, r.unplaced = reason, ReplicaState.PENDING, r.pk in no_room
        changed.append(r)
    if changed:
        update_rows(changed, ["reason", "state", "unplaced"])
        events.changed(replicas=[r.pk for r in changed])


def _requests(
    specs: dict[str, Any],
    replicas: list[replace.ReplicaRow],
    profiles: dict[str, tuple[placement.PlacementProfile, ...]],
) -> list[placement.Request]:
    """Return a placement request for each wanted replica without a node (filling in
    ``profiles`` for their models)."""
    requests = []
    placed_count: dict[str, int] = defaultdict(int)
    for r in replicas:
        if r.desired and r.held:
            placed_count[r.model_name] += 1
    for r in replicas:
        m = specs.get(r.model_name)
        if not r.held and r.desired and m is not None:
            if m.name not in profiles:
                profiles[m.name] = profiles_of(m)
            # A model's first replica ranks above another model's second, within a class.
            n = placed_count[m.name]
            placed_count[m.name] += 1
            rank = rules.class_rank(rules.effective_class(m))
            requests.append(
                placement.Request(str(r.pk), m.name, profiles[m.name], rank, priority=-n)
            )
    return requests


def _plan_placement(
    specs: dict[str, Any],
    snap: replace.Snapshot,
    requests: list[placement.Request],
    profiles: dict[str, tuple[placement.PlacementProfile, ...]],
) -> tuple[placement.Plan, dict[int, str]]:
    """Decide where the requests go; return the plan and the replicas that wait (why)."""
    # A drain's replacement whose replica still serves makes before it breaks: it never
    # evicts a model's last ready replica no other node could hold, as the evicted model
    # would never get the drained room back. (A roll's may: the room its replica leaves
    # is the evicted model's when the roll ends.)
    replicas = snap.replicas
    by_pk = {r.pk: r for r in replicas}
    ready: dict[str, set[int]] = defaultdict(set)
    draining: set[int] = set()
    for r in replicas:
        if r.desired and r.state == ReplicaState.READY and r.held:
            ready[r.model_name].add(r.pk)
            if any(a.cordoned for a in r.held):
                draining.add(r.pk)
    patient = [q.key for q in requests if by_pk[int(q.key)].replaces_id in draining]
    for name in ready if patient else ():
        if name not in profiles and name in specs:
            profiles[name] = profiles_of(specs[name])
    result_plan, held = placement.place_sparing(
        snap.p_nodes, snap.domains, snap.running, requests, ready, patient, profiles,
        quotas=tenancy.book(specs),  # each owner's quotas (cluster.quotas)
    )  # fmt: skip
    # An eviction that would leave a model dark waits for a replacement elsewhere.
    result_plan, waiting = replace.spare_evicted(specs, snap, result_plan)
    waiting.update({int(k): h.reason for k, h in held.items()})
    return result_plan, waiting


def _evict(result_plan: placement.Plan, result: TickResult) -> set[int]:
    """Apply the plan's evictions (in a fixed number of queries); return the nodes whose
    replicas changed."""
    if not result_plan.evictions:
        return set()
    ids = {int(e.running_id): e for e in result_plan.evictions}
    held = list(
        Assignment.objects.filter(replica_id__in=list(ids)).values_list("replica_id", "node_id")
    )
    bumped = {node_id for _, node_id in held}
    on_nodes = {rid for rid, _ in held}
    release(
        {rid: ids[rid].reason for rid in on_nodes},
        evicted_by={rid: ids[rid].for_key for rid in on_nodes},
    )
    for rid in set(ids) - on_nodes:  # off its nodes already: only what it made way for
        Replica.objects.filter(pk=rid).update(evicted_by=ids[rid].for_key)
    events.changed(replicas=list(ids))
    result.evicted.extend(int(e.running_id) for e in result_plan.evictions)
    return bumped


def _assign(
    specs: dict[str, Any], snap: replace.Snapshot, result_plan: placement.Plan, result: TickResult
) -> set[int]:
    """Put the plan's placed replicas on their nodes (in a fixed number of queries: the
    replicas read, written back in one update, their assignments created in one insert);
    return the nodes they went to."""
    if not result_plan.placed:
        return set()
    rows = Replica.objects.in_bulk([int(pl.key) for pl in result_plan.placed])
    bumped: set[int] = set()
    placed: list[Replica] = []
    shares: list[Assignment] = []
    for pl in result_plan.placed:
        r = rows.get(int(pl.key))
        if r is None:
            continue  # stopped and deleted since the snapshot: nothing to place
        m = specs[r.model_name]
        profile = rules.profile_by_name(m, pl.profile)
        r.profile = pl.profile
        r.fingerprint = rules.fingerprint(profile) if profile else ""
        where = f"placed on {', '.join(a.node for a in pl.assignments)}"
        r.set_state(ReplicaState.PENDING, f"{where} ({pl.note})" if pl.note else where)
        r.unplaced = False
        placed.append(r)
        for rank, a in enumerate(pl.assignments):
            node_id = snap.node_pks[a.node]
            shares.append(
                Assignment(
                    replica=r,
                    node_id=node_id,
                    rank=rank,
                    cards=list(a.cards),
                    cpu_cores=a.cpu_cores,
                    memory_mb=a.memory_mb,
                    disk_mb=a.disk_mb,
                    watts=a.watts,
                )  # fmt: skip
            )
            bumped.add(node_id)
        result.placed.append(r.pk)
    fields = ["profile", "fingerprint", "state", "reason", "state_changed", "ready_since"]
    update_rows(placed, [*fields, "unplaced"])
    Assignment.objects.bulk_create(shares)
    # What saving each would have told the consoles (``cluster.signals``).
    events.changed(
        models=sorted({r.model_name for r in placed}),
        nodes=sorted(bumped),
        replicas=[r.pk for r in placed],
    )
    return bumped


def _make_room(
    wants: dict[str, plan.Want],
    specs: dict[str, Any],
    snap: replace.Snapshot,
    done: placement.Plan,
    result: TickResult,
) -> dict[int, str]:
    """Replace one at a time where a roll's replacement has no room beside its replica.

    A replacement placement could not put anywhere is tried again in the room of the
    replica it replaces; where it would fit there, ``plan.make_room`` decides whether
    that replica stops first now. Return the reasons the blocked replacements show.
    """
    by_pk = {r.pk: r for r in snap.replicas}
    # Those whose replica already stops first wait for its room, and say so.
    reasons = {
        int(u.key): f"{plan.ONE_AT_A_TIME} #{old.pk} for #{u.key}: replacing one replica "
        f"at a time; waiting for #{old.pk} to stop"
        for u in done.unplaced
        if (r := by_pk.get(int(u.key))) is not None
        and (old := by_pk.get(r.replaces_id)) is not None
        and not old.desired
    }
    unplaced = [
        int(u.key)
        for u in done.unplaced
        if (r := by_pk.get(int(u.key))) is not None
        and r.replaces_id in by_pk
        and by_pk[r.replaces_id].desired
        and by_pk[r.replaces_id].held
    ]
    if not unplaced:
        return reasons
    ranks = {name: rules.class_rank(rules.effective_class(m)) for name, m in specs.items()}
    taken = [replace.running_of(pl, ranks.get(pl.model, 1)) for pl in done.placed]
    evicted = {e.running_id for e in done.evictions}
    blocked = []
    for rid in unplaced:
        new = by_pk[rid]
        others = [x for x in snap.running if x.id != new.replaces_id and x.id not in evicted]
        m = specs[new.model_name]
        alone = placement.Request(str(rid), m.name, profiles_of(m), ranks.get(m.name, 1))
        trial = placement.place(snap.p_nodes, snap.domains, others + taken, [alone])
        if trial.placed and not trial.evictions:
            blocked.append(rid)
    if not blocked:
        return reasons
    stops, waits = plan.make_room(wants, _views(specs, snap.replicas), blocked)
    for old_id, why in stops:
        services.stop_replicas([old_id], why)
        result.stopped.append(old_id)
    return reasons | waits


def run_forever(interval: float, stop: threading.Event | None = None) -> None:
    """Tick every ``interval`` seconds, and when woken (``cluster.wake``), until ``stop``.

    The embedded mode's loop. Setting ``stop`` takes effect at the next wake-up or
    interval; ``wake.wake()`` makes that now.
    """
    stop = stop or threading.Event()
    start_listening()
    wake.loop_started()
    while not stop.is_set():
        started = time.monotonic()
        try:
            close_old_connections()
            tick()
        except Exception:
            log.exception("reconcile tick failed; trying again next tick")
        wake.wait(max(0.0, interval - (time.monotonic() - started)))
