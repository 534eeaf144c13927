"""The policy snapshot: what a check reads, the policy in force and its judges as the
catalog and the cluster have them, kept in memory.

A check reads nothing from the database in the steady state: the policy and its judges'
ready endpoints are a ``Snapshot`` kept in memory (``snapshot``) for ``SNAPSHOT_TTL``
seconds (read again in the background from half that age, so checks do not wait for
it), dropped at once when this process commits a change to the policy, to a judge in
the catalog or to a judge's replica (``forget``, ``forget_if_held``: ``guard.signals``),
and read again (once) when a check met a failure it may owe to an old snapshot
(``reread``: ``guard.checks``).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection, transaction

from catalog import rules
from catalog.models import ServedModel
from cluster.choices import ReplicaState
from cluster.enginekeys import engine_key
from cluster.models import Replica
from guard import client, formats, known
from guard import policy as policy_rules
from guard.cache import Cached
from guard.chain import JudgeRef
from guard.models import GuardPolicy

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 8192


# How long a check may use the policy and the judges' endpoints it read before (seconds):
# how late another process's change, or one no signal tells of, is seen here.
SNAPSHOT_TTL = 1.0


_parsed: tuple[Any, policy_rules.Policy] | None = None


def stored_policy() -> tuple[policy_rules.Policy, bool]:
    """Return the policy in force and whether one is stored (one query).

    The stored data is parsed again only when it changed.
    """
    data = GuardPolicy.objects.order_by("pk").values_list("data", flat=True).first()
    if data is None:
        return policy_rules.BASELINE, False
    return parse_stored(data), True


def parse_stored(data: Any) -> policy_rules.Policy:
    """Return a stored policy's data parsed (again only when it changed)."""
    global _parsed
    if _parsed is not None and _parsed[0] == data:
        return _parsed[1]
    parsed, problems = policy_rules.validate(data)
    # A stored policy was valid when written; one that no longer reads (an older
    # release's keys) falls back to the baseline rather than judging with nothing.
    result = parsed if parsed is not None and not problems else policy_rules.BASELINE
    _parsed = (data, result)
    return result


@dataclass(frozen=True)
class Judge:
    """A judge the policy names, as the catalog and the cluster have it now."""

    name: str
    format: str | None
    categories: tuple[str, ...]
    variant: str | None
    context_length: int
    endpoint: str | None
    # How long one ask may take in all (seconds): from the model's slo, else
    # LLMGW_GUARD_JUDGE_TIMEOUT (guard.client.judge_timeout).
    timeout: float
    # Why the chain cannot ask it, when it is not a guard model in the catalog.
    missing: str = ""
    # The engine key of the replica at ``endpoint`` (cluster.enginekeys): sent with every
    # call to it, never shown (not in the repr a log or a traceback would print).
    key: str = field(default="", repr=False)

    @property
    def ref(self) -> JudgeRef:
        """Return the chain's view: ready when a replica answers and the format is known."""
        ready = bool(self.endpoint and self.format)
        return JudgeRef(self.name, ready=ready, reason=self.missing or "no ready replica")


def judges(names: Sequence[str]) -> list[Judge]:
    """Return the named judges in order, each with a ready replica's endpoint if any.

    Two queries, reading only the columns a check needs (every check asks).
    """
    rows = {
        r["name"]: r
        for r in ServedModel.objects.filter(name__in=list(names)).values(
            "name",
            "role",
            "guard_format",
            "guard_categories",
            "context_length",
            "slo_ttft_p99",
            "slo_tpot_p99",
        )  # fmt: skip
    }
    endpoints: dict[str, tuple[str, int]] = {}
    for name, endpoint, rid in (
        Replica.objects.filter(model_name__in=list(names), state=ReplicaState.READY, desired=True)
        .exclude(endpoint="")
        .order_by("-ready_since")
        .values_list("model_name", "endpoint", "id")
    ):
        endpoints.setdefault(name, (endpoint, rid))
    out = []
    for name in names:
        row = rows.get(name)
        kj = known.KNOWN.get(name)
        is_judge = bool(row and row["role"] == rules.ROLE_GUARD and row["guard_format"])
        out.append(
            Judge(
                name=name,
                format=row["guard_format"] if is_judge and row else None,
                categories=tuple(row["guard_categories"] or ()) if row else (),
                variant=kj.variant if kj else None,
                context_length=(row["context_length"] if row and row["context_length"] else 0)
                or (kj.context_length if kj else DEFAULT_CONTEXT),
                endpoint=endpoints[name][0] if name in endpoints else None,
                key=engine_key(endpoints[name][1]) if name in endpoints else "",
                missing=_missing(name, row is not None, is_judge),
                timeout=client.judge_timeout(
                    row["guard_format"] if row else None,
                    row["slo_ttft_p99"] if row else 0,
                    row["slo_tpot_p99"] if row else 0,
                    default_timeout(),
                ),
            )
        )
    return out


def _missing(name: str, in_catalog: bool, is_judge: bool) -> str:
    if is_judge:
        return ""
    if in_catalog:
        return "in the catalog, but not as a guard model with a format"
    if name in known.KNOWN:
        return (
            "not in the catalog: the leader adds a known judge the policy names, unless an "
            f"operator deleted it since the policy last changed (guard judge enable {name})"
        )
    return "not in the catalog, and not a known judge"


@dataclass(frozen=True)
class Snapshot:
    """What a check reads: the policy in force and its judges as the cluster has them."""

    policy: policy_rules.Policy
    stored: bool
    judges: tuple[Judge, ...]
    # Read again because a check failed: the next failure does not read it again (a
    # judge that stays down costs no query per check).
    reread: bool = False

    @property
    def names(self) -> frozenset[str]:
        """Return the policy's judge names (a change to one of them drops the snapshot)."""
        return frozenset(self.policy.judge_models)


def _load_snapshot(reread: bool = False) -> Snapshot:
    """Read the snapshot from the database: three queries."""
    pol, stored = stored_policy()
    found = tuple(judges(pol.judge_models))
    return Snapshot(_as_judges_hold(pol, found), stored, found, reread)


def _as_judges_hold(pol: policy_rules.Policy, found: Sequence[Judge]) -> policy_rules.Policy:
    """Return the policy with each category's equivalents its judges report added.

    Every save completes the policy (``prepare_policy``), but one stored before that rule,
    or whose judges' catalog rows changed since, may not be: a Llama Guard's "Violent
    Crimes" must refuse whenever "Violent" does, whatever was stored. Only ever adds, so
    the policy in force refuses no less than the stored one.
    """

    reports: dict[str, tuple[str, ...]] = {}
    for j in found:
        if j.format and j.format in formats.FORMATS:
            reports[j.name] = formats.reported_categories(j.format, j.categories or None, j.variant)
        else:
            kj = known.KNOWN.get(j.name)
            reports[j.name] = kj.categories if kj else ()
    done, _, _ = policy_rules.complete(pol, reports, drop_unreportable=True)
    have = {c.casefold() for c in pol.refuse_categories}
    extra = [c for c in (done.refuse_categories if done else ()) if c.casefold() not in have]
    if not extra:
        return pol
    return dataclasses.replace(pol, refuse_categories=(*pol.refuse_categories, *extra))


def in_background(job: Callable[[], None]) -> None:
    """Run a cache's refresh ahead in a thread of its own (its database connection closed
    after), so the check that found a value half-way to expiry does not wait for it."""

    def run() -> None:
        try:
            job()
        except Exception:
            log.exception("a guard cache's refresh ahead failed; the next reader loads it")
        finally:
            connection.close()

    threading.Thread(target=run, name="guard-refresh", daemon=True).start()


_snapshot: Cached[Snapshot] = Cached(
    _load_snapshot, ttl=SNAPSHOT_TTL, ahead=in_background, name="the guard's policy and judges"
)


def kept() -> Cached[Snapshot]:
    """The snapshot as memory holds it: a gateway's table reader keeps it fresh (its
    ``keep``) so checks never wait for it, and reports its age. When the database fails,
    checks are served the last snapshot read (``guard.cache``)."""
    return _snapshot


def snapshot() -> Snapshot:
    """Return the policy and its judges, from memory when fresh.

    Inside a transaction it is read from the database and not kept: what a transaction
    sees before it commits (or as it rolls back) is not for other checks.
    """
    if connection.in_atomic_block:
        return _load_snapshot()
    return _snapshot.get()


def reread() -> Snapshot:
    """Read the snapshot again now (a check met a failure it may owe to an old one),
    marked read again so the next failure does not read it once more."""
    return _snapshot.refresh(lambda: _load_snapshot(reread=True))


def forget() -> None:
    """Drop the snapshot now and once more when the current transaction commits."""
    _snapshot.invalidate()
    transaction.on_commit(_snapshot.invalidate)


def forget_if_held(name: str) -> None:
    """Drop the snapshot if it holds the model ``name`` (its row or a replica of it
    changed; ``guard.signals``)."""
    held = _snapshot.peek()
    if held is not None and name in held.names:
        forget()


def default_timeout() -> float:
    """A judge's timeout when its model has no slo (``LLMGW_GUARD_JUDGE_TIMEOUT``)."""
    return float(settings.LLMGW_GUARD_JUDGE_TIMEOUT)


def policy_in_memory() -> policy_rules.Policy | None:
    """The policy in force when this process holds it fresh, else None (never queries):
    the gateway asks it whether to judge a request at all before leaving its loop."""
    snap = _snapshot.fresh()
    return None if snap is None else snap.policy
