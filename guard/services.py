"""Guard operations over the database: the policy, the judges it names, checks, records.

Used by the guard API, the ``guard`` command, ``init`` and the reconciler. The rules are
the pure modules': ``guard.policy`` (what a policy may say, what a verdict decides),
``guard.chain`` (judges in turn), ``guard.client`` (asking one judge), ``guard.known``
(judges llmgw knows), ``guard.cache`` (what checks keep in memory).

A check reads nothing from the database in the steady state: the policy and its judges'
ready endpoints are a ``Snapshot`` kept in memory (``snapshot``) for ``SNAPSHOT_TTL``
seconds (read again in the background from half that age, so checks do not wait for
it), dropped at once when this process commits a change to the policy, to a judge in
the catalog or to a judge's replica, and reloaded (once) when a check met a failure it
may owe to an old snapshot. Results are written in batches off the request path
(``guard.records``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from catalog import rules
from catalog.models import ServedModel
from catalog.problems import Problem
from cluster import wake
from cluster.choices import ReplicaState
from cluster.enginekeys import engine_key
from cluster.models import Replica
from guard import breaker, client, formats, known, perrequest, pool, records, reprobe
from guard import policy as policy_rules
from guard.cache import Cached
from guard.chain import ChainResult, Failure, JudgeRef, Stats, run_chain
from guard.models import GuardPolicy, JudgeHealth, JudgeProbe, PolicyChange
from llmgw_core.refused import Refused

log = logging.getLogger(__name__)

DEFAULT_CONTEXT = 8192
# How long a check may use the policy and the judges' endpoints it read before (seconds):
# how late another process's change, or one no signal tells of, is seen here.
SNAPSHOT_TTL = 1.0


class PolicyRefused(Refused):
    """A policy the rules refuse; nothing was written."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(f"{p.field}: {p.message}" for p in problems))
        self.problems = list(problems)


_parsed: tuple[Any, policy_rules.Policy] | None = None


def current_policy() -> policy_rules.Policy:
    """Return the policy in force: the stored one, or the built-in baseline, as its
    judges hold it (``_as_judges_hold``).

    From the snapshot (``snapshot``): inside a transaction, as that transaction sees it.
    """
    if connection.in_atomic_block:
        return _load_snapshot().policy
    return _snapshot.get().policy


def _stored_policy() -> tuple[policy_rules.Policy, bool]:
    """Return the policy in force and whether one is stored (one query).

    The stored data is parsed again only when it changed.
    """
    data = GuardPolicy.objects.order_by("pk").values_list("data", flat=True).first()
    if data is None:
        return policy_rules.BASELINE, False
    return _parse_stored(data), True


def _parse_stored(data: Any) -> policy_rules.Policy:
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


def judge_reports() -> dict[str, tuple[str, ...]]:
    """Return every judge a policy may name, with the categories its verdicts report.

    The catalog's guard models with a format (their ``guard.categories``, else their
    format's own names), and the known judges the catalog lacks (the leader adds one
    the policy names). A catalog model of a known judge's name that is no guard model
    is no judge. One query.
    """
    out: dict[str, tuple[str, ...]] = {name: kj.categories for name, kj in known.KNOWN.items()}
    for row in ServedModel.objects.values("name", "role", "guard_format", "guard_categories"):
        name = row["name"]
        out.pop(name, None)
        fmt = row["guard_format"]
        if row["role"] != rules.ROLE_GUARD or not fmt or fmt not in formats.FORMATS:
            continue
        kj = known.KNOWN.get(name)
        out[name] = formats.reported_categories(
            fmt, row["guard_categories"] or None, kj.variant if kj else None
        )
    return out


@dataclass(frozen=True)
class Prepared:
    """A policy as it would be saved: parsed, completed for its judges, what that changed."""

    policy: policy_rules.Policy | None
    notes: list[str]
    problems: list[Problem]


def prepare_policy(data: Any, *, categories_given: bool = True) -> Prepared:
    """Return a policy's data checked and completed as every surface saves it.

    ``guard.policy.validate`` (the shape), then ``guard.policy.complete`` against the
    judges there are (``judge_reports``): each judge must be one, each category
    reported by one of them or replaced by equivalents one reports, and each category
    held in every judge's own names. Problems carry the key's path. A category no listed
    judge can report is refused, unless the change did not give the categories
    (``categories_given`` false: a PATCH or ``policy set`` flags changing only the
    judges), when it is removed and said, as ``guard judge use`` does.
    """
    parsed, problems = policy_rules.validate(data)
    if problems or parsed is None:
        return Prepared(None, [], list(problems))
    done, changes, problems = policy_rules.complete(
        parsed, judge_reports(), drop_unreportable=not categories_given
    )
    return Prepared(done, [c.line() for c in changes], problems)


@dataclass(frozen=True)
class Saved:
    """What ``save_policy`` stored, what completing it changed, and whether it changed."""

    policy: policy_rules.Policy
    notes: list[str]
    changed: bool


@transaction.atomic
def save_policy(
    data: Any,
    *,
    user: Any = None,
    surface: str,
    name: str = "",
    categories_given: bool = True,
) -> Saved:
    """Check, complete (``prepare_policy``) and store a policy, logging who changed it.

    Raises:
        PolicyRefused: the policy's problems, each at its key; nothing was written.
    """
    prepared = prepare_policy(data, categories_given=categories_given)
    if prepared.problems or prepared.policy is None:
        raise PolicyRefused(prepared.problems)
    parsed = prepared.policy
    before = policy_rules.to_data(current_policy())
    after = policy_rules.to_data(parsed)
    row = GuardPolicy.objects.select_for_update().order_by("pk").first()
    if row is None:
        GuardPolicy.objects.create(data=after)
    elif row.data != after:
        row.data = after
        row.save()
    else:
        return Saved(parsed, prepared.notes, False)
    who = getattr(user, "username", "") or name or "system"
    changed = policy_rules.changes(before, after)
    PolicyChange.objects.create(
        actor=user if getattr(user, "pk", None) else None,
        actor_name=who,
        surface=surface,
        before=before,
        after=after,
        summary=", ".join(changed) or "set",
    )
    # The policy may name a known judge the catalog lacks: the reconciler adds and serves it.
    wake.reconcile_soon()
    return Saved(parsed, prepared.notes, True)


def set_policy(
    data: Any,
    *,
    user: Any = None,
    surface: str,
    name: str = "",
    categories_given: bool = True,
) -> policy_rules.Policy:
    """Check, complete and store a policy (``save_policy``); return it as stored."""
    return save_policy(
        data, user=user, surface=surface, name=name, categories_given=categories_given
    ).policy


@dataclass(frozen=True)
class Judge:
    """A judge the policy names, as the catalog and the cluster have it now."""

    name: str
    format: str | None
    categories: tuple[str, ...]
    variant: str | None
    context_length: int
    endpoint: str | None
    # Why the chain cannot ask it, when it is not a guard model in the catalog.
    missing: str = ""
    # How long one ask may take in all (seconds): from the model's slo, else
    # LLMGW_GUARD_JUDGE_TIMEOUT (guard.client.judge_timeout).
    timeout: float = 5.0
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
    pol, stored = _stored_policy()
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


@dataclass(frozen=True)
class Asked:
    """A judge already asked for this check on the event loop: its answer, or the
    exception it failed with. The chain takes it in that judge's turn, not asking again."""

    judge: str
    outcome: Any
    # When the check began (monotonic): only failures on the request before it skip a
    # judge (guard.perrequest).
    since: float = 0.0


def default_timeout() -> float:
    """A judge's timeout when its model has no slo (``LLMGW_GUARD_JUDGE_TIMEOUT``)."""
    return float(settings.LLMGW_GUARD_JUDGE_TIMEOUT)


# Each judge's circuit breaker in this process (guard.breaker): a judge that keeps failing
# is skipped, and probed again after a back-off, instead of costing every check its
# timeout. Per process: each gateway process counts its own.
BREAKERS = breaker.Breakers(lambda: breaker.Config.from_settings(settings))
# Each change of state is written for the console, off the path (guard.records).
BREAKERS.listen(records.breaker_changed)
# How long past its timeout a probe of a half-open judge holds the others off.
PROBE_MARGIN = 1.0


def _reprobe(name: str) -> None:
    """Ask an open judge once, as the policy in memory has it (``guard.reprobe``): returns
    when it answered, raises when it did not."""
    snap = _snapshot.peek()
    j = next((j for j in snap.judges if j.name == name), None) if snap is not None else None
    if j is None or not j.endpoint or not j.format:
        raise LookupError(f"judge {name} is not a ready judge of the policy in memory")
    client.ask_judge(j.endpoint, j.format, PROBE_ORDINARY, None,
                     **_ask_options(j, snap.policy, None), client=_http())  # fmt: skip


# An open breaker's judge asked off the path until it answers, which closes it at once.
REPROBER = reprobe.Reprober(
    BREAKERS, _reprobe, lambda: float(settings.LLMGW_GUARD_BREAKER_PROBE_EVERY)
)
BREAKERS.listen(REPROBER.changed)


def _lease(j: Judge, timeout: float | None) -> float:
    return _timeout(j, timeout) + PROBE_MARGIN


def _timeout(j: Judge, cap: float | None) -> float:
    """The judge's own timeout, at most ``cap`` when one is given."""
    return j.timeout if cap is None else min(j.timeout, cap)


def _asked_failed(result: ChainResult) -> bool:
    """Whether a judge asked failed (one skipped by its breaker was not asked)."""
    return any(f.kind != breaker.SKIPPED for f in result.failures)


def check(
    request: str,
    answer: str | None = None,
    *,
    timeout: float | None = None,
    asked: Asked | None = None,
) -> dict[str, Any]:
    """Judge a request (and, given, its answer) with the policy's chain; record the result.

    Returns the API's and the command's JSON: decision, verdict, categories, judge, score,
    latency_ms and the failures on the way. Each judge is given its own timeout
    (``Judge.timeout``; at most ``timeout`` when given) and skipped while its breaker is
    open (``BREAKERS``). A chain that met a failure with a snapshot
    from memory reads it again (once per snapshot) and runs once more when the database
    has the policy or its judges otherwise (a replica that moved, or became ready,
    since): only that run is recorded and answered.
    """
    direction = policy_rules.ANSWERS if answer is not None else policy_rules.REQUESTS
    fresh = connection.in_atomic_block
    since = asked.since if asked is not None and asked.since else time.monotonic()
    snap = snapshot()
    result = _run(snap, request, answer, direction, timeout, asked, since=since)
    if _asked_failed(result) and not fresh and not snap.reread:
        again = _snapshot.refresh(lambda: _load_snapshot(reread=True))
        if again.judges != snap.judges or again.policy != snap.policy:
            result = _run(again, request, answer, direction, timeout, since=since)
    record(result)
    return as_json(result)


def check_on_thread(request: str, answer: str | None, asked: Asked | None) -> dict[str, Any]:
    """Run ``check`` on a thread of the caller's own pool, then close the thread's
    database connection (the gateway's judging threads hold none between checks)."""
    try:
        return check(request, answer, asked=asked)
    finally:
        connection.close()


async def check_on_loop(
    request: str, answer: str | None = None, *, timeout: float | None = None
) -> dict[str, Any] | Asked | None:
    """``check`` without leaving the event loop, when it needs no query and no blocking call.

    That is: the recorder is running, the policy and its judges are fresh in memory, the
    first ready judge in the policy's order fits the text by the safe estimate
    (``guard.client.ask_judge_on_loop``) and answers, and no judge before it failed
    with a snapshot not yet read again (``check`` reads it again then). Returns
    ``check``'s JSON then, recorded. Returns ``Asked`` when that judge was asked and the
    rest is ``check``'s (it failed, or the snapshot is to be read again): pass it to
    ``check`` on a thread, which does not ask it again. Returns None when nothing was
    asked and ``check`` is to do it all.
    """
    if not records.RECORDER.running:
        return None  # each result would be written at once: a query
    snap = _snapshot.fresh()
    if snap is None:
        return None
    direction = policy_rules.ANSWERS if answer is not None else policy_rules.REQUESTS
    if not snap.policy.judges(direction):
        return None
    since = time.monotonic()
    mine = perrequest.current()
    # The first ready judge its breaker lets be asked (the ones before it are skipped,
    # as the chain records them), not one that failed on this request already.
    first = None
    for j in snap.judges:
        if mine is not None and j.name in mine.failed:
            continue
        if j.ref.ready and BREAKERS.admit(j.name, _lease(j, timeout)) != breaker.SKIP:
            first = j
            break
    if first is None:
        # Every judge skipped or not ready: fail decides, without leaving the loop.
        result = _run(snap, request, answer, direction, timeout, blocking=False, since=since)
        if result is None or _asked_failed(result):
            return None
        record(result)
        return as_json(result)
    try:
        outcome = await client.ask_judge_on_loop(
            first.endpoint or "", first.format or "", request, answer,
            **_ask_options(first, snap.policy, timeout), conns=_http_on_loop(),
        )  # fmt: skip
    except Exception as error:  # a failure of the judge's (or a bug): the chain goes on
        kind = getattr(error, "kind", None) or "error"
        BREAKERS.failed(first.name, kind)
        if mine is not None:
            mine.fail(first.name, kind)
        return Asked(first.name, error, since)
    if outcome is None:
        BREAKERS.release(first.name)  # not asked here: check asks it on a thread
        return None
    BREAKERS.succeeded(first.name)
    asked = Asked(first.name, outcome, since)
    result = _run(snap, request, answer, direction, timeout, asked, blocking=False, since=since)
    if result is None or (_asked_failed(result) and not snap.reread):
        # A judge after it is to be asked, or the failures before it may mean the
        # snapshot is stale: a thread reads it again and goes on.
        return asked
    record(result)
    return as_json(result)


def _ask_options(j: Judge, pol: Any, timeout: float | None) -> dict[str, Any]:
    """Return what ``guard.client`` is told about a judge, beyond the texts."""
    return {
        "context_length": j.context_length,
        "categories": j.categories or None,
        "variant": j.variant,
        "timeout": _timeout(j, timeout),
        "model": j.name,
        "controversial": pol.controversial,
        "key": j.key,
    }


class _Blocking(Exception):
    """A judge the event loop cannot ask: the chain goes on on a thread."""


def _run(
    snap: Snapshot,
    request: str,
    answer: str | None,
    direction: str,
    timeout: float | None,
    asked: Asked | None = None,
    *,
    blocking: bool = True,
    since: float | None = None,
) -> ChainResult | None:
    """Run the chain on a snapshot; None when ``blocking`` is false and a judge other
    than ``asked``'s was to be asked.

    A judge whose breaker is open is skipped (``guard.breaker.Skipped``), and one that
    failed on this client request before ``since`` (``guard.perrequest``); each judge
    asked tells its breaker how it went (``asked``'s was told by ``check_on_loop``).
    """
    mine = perrequest.current()
    since = time.monotonic() if since is None else since
    pol = snap.policy
    by_name = {j.name: j for j in snap.judges}
    # One client for every check: making one costs tens of milliseconds.
    http = _http()
    stopped = False

    def ask(ref: JudgeRef) -> Any:
        nonlocal stopped
        if asked is not None and ref.name == asked.judge:
            if isinstance(asked.outcome, BaseException):
                raise asked.outcome
            return asked.outcome
        j = by_name[ref.name]
        if mine is not None:
            mine.skip(ref.name, since)
        if not blocking:
            # Skipped or not, decided without claiming a probe the loop will not make.
            if BREAKERS.peek(ref.name, _lease(j, timeout)) == breaker.SKIP:
                raise breaker.Skipped(_skipped(ref.name))
            stopped = True
            raise _Blocking
        if BREAKERS.admit(ref.name, _lease(j, timeout)) == breaker.SKIP:
            raise breaker.Skipped(_skipped(ref.name))
        try:
            answer_ = client.ask_judge(
                j.endpoint or "", j.format or "", request, answer,
                **_ask_options(j, pol, timeout), client=http,
            )  # fmt: skip
        except Exception as error:
            kind = getattr(error, "kind", None) or "error"
            BREAKERS.failed(ref.name, kind)
            if mine is not None:
                mine.fail(ref.name, kind)
            raise
        BREAKERS.succeeded(ref.name)
        return answer_

    result = run_chain(pol, [j.ref for j in snap.judges], ask, direction=direction)
    return None if stopped else result


def _skipped(name: str) -> str:
    """Why a judge was skipped, as its failure says it."""
    s = BREAKERS.state(name)
    when = ""
    if s.next_probe is not None:
        when = f"; asked again from {datetime.fromtimestamp(s.next_probe, tz=UTC):%H:%M:%S} UTC"
    return (
        f"not asked: its circuit breaker is {s.state.replace('_', '-')} after "
        f"{s.failures} failures in a row (the last: {s.last_kind or '?'}){when}"
    )


_client: pool.Pool | None = None
_loop_pools: weakref.WeakKeyDictionary[Any, pool.AsyncPool] = weakref.WeakKeyDictionary()


def _http_on_loop() -> pool.AsyncPool:
    """Return the running event loop's connections to judges (made once per loop)."""
    loop = asyncio.get_running_loop()
    found = _loop_pools.get(loop)
    if found is None:
        found = _loop_pools[loop] = pool.AsyncPool()
    return found


def _http() -> pool.Pool:
    """Return the process's connections to judges (made once; thread-safe, kept alive,
    so every check reuses them: ``guard.pool``)."""
    global _client
    if _client is None:
        _client = pool.Pool()
    return _client


# Past what its judges' timeouts allow (each asked at most twice: the chain and its run
# again after the snapshot is read again), and this margin for the reads and the thread
# pool's queue, a check is given up on: ``unanswered``.
CHECK_MARGIN = 10.0


def check_bound() -> float:
    """The longest a gateway waits for one check, from the policy in memory's judges."""
    snap = _snapshot.peek()
    if snap is None or not snap.judges:
        return 2 * default_timeout() + CHECK_MARGIN
    return 2 * sum(j.timeout for j in snap.judges) + CHECK_MARGIN


def unanswered(request: str, answer: str | None, bound: float) -> dict[str, Any]:
    """A check given up on after ``bound`` seconds: as if every judge timed out, so the
    policy's ``fail`` decides (``fail: closed`` refuses; no policy in memory: refused)."""
    snap = _snapshot.peek()
    direction = policy_rules.ANSWERS if answer is not None else policy_rules.REQUESTS
    message = f"the check got no answer within {bound:g} s"
    if snap is None:
        failure = Failure("", "timeout", message, timezone.now())
        return as_json(ChainResult("refuse", None, (), None, None, None, [failure]))

    def ask(ref: JudgeRef) -> Any:
        raise client.JudgeFailure("timeout", message)

    return as_json(run_chain(snap.policy, [j.ref for j in snap.judges], ask, direction=direction))


def as_json(result: ChainResult) -> dict[str, Any]:
    """Return a chain's result as the check API answers it."""
    return {
        "decision": result.decision,
        "verdict": result.verdict,
        "categories": list(result.categories),
        "judge": result.judge,
        "score": result.score,
        "latency_ms": None if result.latency_ms is None else round(result.latency_ms, 1),
        "failures": [
            {"judge": f.judge, "kind": f.kind, "message": f.message, "at": f.at.isoformat()}
            for f in result.failures
        ],
        "judged": result.judged,
        "failed_open": result.failed_open,
        "request_cut": result.request_cut,
        "answer_cut": result.answer_cut,
    }


def record(result: ChainResult) -> None:
    """Count failures against their judges and the decider's verdict per category.

    In the web process the recorder gathers it and writes it within
    ``LLMGW_GUARD_FLUSH_MS``; elsewhere, or inside a transaction (it is then
    that transaction's to keep or roll back), it is written at once.
    """
    if records.RECORDER.running and not connection.in_atomic_block:
        records.RECORDER.add(result)
        return
    stats = Stats()
    stats.record(result)
    records.write(stats)


def flush_records() -> None:
    """Write what this process's checks did and has not written yet (before reading it)."""
    if records.RECORDER.pending():
        records.RECORDER.flush()


def _bump_health(judge: str, **changes: Any) -> None:
    if not JudgeHealth.objects.filter(judge=judge).update(**changes):
        JudgeHealth.objects.get_or_create(judge=judge)
        JudgeHealth.objects.filter(judge=judge).update(**changes)


def cluster_shape() -> tuple[list[int], dict[str, int]]:
    """Return the ready nodes' core counts and each GPU class's largest memory (MiB)."""
    from cluster.choices import NodeHealth
    from cluster.models import Card, Node

    cores = list(Node.objects.filter(health=NodeHealth.READY).values_list("cpu_cores", flat=True))
    classes: dict[str, int] = {}
    for gpu_class, memory in Card.objects.filter(node__health=NodeHealth.READY).values_list(
        "gpu_class", "memory_mb"
    ):
        classes[gpu_class] = max(classes.get(gpu_class, 0), memory)
    return cores, classes


def enable_judge(name: str | None, *, gpu: bool, sim: bool, actor: Any) -> tuple[str, bool]:
    """Add a known judge to the catalog (or update it), served as asked; return its name
    and whether anything changed. Safe to run again."""
    from catalog import codec
    from catalog import services as catalog_services

    cores, classes = cluster_shape()
    spec = known.enable_spec(name, gpu=gpu, node_cores=cores, gpu_classes=classes, sim=sim)
    existing = ServedModel.objects.filter(name=spec.name).first()
    if existing is not None:
        before = codec.encode_model(rules.normalize(existing.to_spec()))
        if before == codec.encode_model(rules.normalize(spec)):
            return spec.name, False
    catalog_services.save_model(spec, actor, replacing=spec.name if existing else None)
    return spec.name, True


# Who the change log names for what the leader does on its own.
LEADER = "reconciler"
_leader_warned: dict[str, str] = {}


def serve_policy_judges() -> list[str]:
    """Add to the catalog, and so serve, each known judge the stored policy names and the
    catalog lacks (the reconciler's leader calls it every tick); return the names added.

    Added as ``guard judge enable NAME`` adds it (a CPU llama.cpp profile), logged as
    done by the reconciler with the reason. What ``known.judges_to_add`` decides: a name
    in the catalog is never touched, and a judge an operator deleted after the policy last
    changed stays deleted (the later word wins) until the policy is saved again or the
    judge enabled. Before a policy is stored (``init`` stores the baseline) it adds
    nothing. A judge the catalog refuses (or an operator adds at the same moment) is left
    out and said once in the log: the tick goes on. Two queries when nothing is missing.
    """
    from django.db import IntegrityError

    from catalog.choices import ChangeAction, Surface
    from catalog.models import ChangeRecord
    from catalog.services import Actor, Refused

    row = GuardPolicy.objects.order_by("pk").values("data", "updated").first()
    if row is None:
        return []
    names = list(_parse_stored(row["data"]).judge_models)
    present = set(ServedModel.objects.filter(name__in=names).values_list("name", flat=True))
    missing = [n for n in names if n not in present and n in known.KNOWN]
    if not missing:
        return []
    deletions = dict(
        ChangeRecord.objects.filter(model_name__in=missing, action=ChangeAction.DELETE)
        .order_by("at")
        .values_list("model_name", "at")
    )  # the latest deletion of each
    deleted_since = {n for n, at in deletions.items() if at > row["updated"]}
    added = []
    for name in known.judges_to_add(names, present, deleted_since):
        why = "the guard policy names it" + (
            "; re-added: deleted before the policy last changed" if name in deletions else ""
        )
        try:
            with transaction.atomic():
                enable_judge(
                    name,
                    gpu=False,
                    sim=False,
                    actor=Actor(user=None, surface=Surface.CLI, name=LEADER, via=why),
                )
        except (Refused, ValueError, IntegrityError) as exc:
            if _leader_warned.get(name) != str(exc):
                _leader_warned[name] = str(exc)
                log.warning("the policy names judge %s; adding it was refused: %s", name, exc)
            continue
        _leader_warned.pop(name, None)
        log.info("added judge %s to the catalog: %s", name, why)
        added.append(name)
    for name in sorted(deleted_since - set(present)):
        if _leader_warned.get(name) != "deleted":
            _leader_warned[name] = "deleted"
            log.info(
                "the policy names judge %s, deleted from the catalog since the policy last "
                "changed: left out (guard judge enable %s, or save the policy, to add it)",
                name,
                name,
            )
    return added


def switch_off_warnings(before: Any, after: Any) -> list[str]:
    """Return the warning for a change that switches off (max 0) the only judge of the
    policy that answers: no judge will answer, so the policy's ``fail`` decides every
    check (``catalog.signals.change_warnings``; two queries when it is a policy judge)."""
    if before is None or after is None or after.scaling.max != 0 or before.scaling.max == 0:
        return []
    pol = current_policy()
    if after.name not in pol.judge_models or not pol.directions:
        return []
    if any(j.ref.ready for j in judges(pol.judge_models) if j.name != after.name):
        return []
    what = " and ".join(pol.directions)
    if pol.fail == policy_rules.FAIL_CLOSED:
        then = f"the guard fails closed: every one of the {what} it judges is refused"
    else:
        then = f"the guard fails open: the {what} it judges are allowed unjudged"
    return [
        f"{after.name} was the only judge of the guard policy that answers: switched off, "
        f"no judge answers and {then} (the policy's fail: {pol.fail}). Enable another judge "
        "or give this one a replica again (scaling.max 1)"
    ]


def policy_refusals(before: Any, after: Any) -> list[Problem]:
    """Refuse a catalog change that takes a judge the policy in force names out of it:
    deleted, renamed or no longer role guard (``catalog.signals.change_refusals``; the
    policy is read only when ``before`` is a judge). The judge comes out of the policy
    first (or the policy judges nothing: ``directions: []``), as a model comes out of
    another's fallbacks before it is deleted: else the policy names a judge that is not
    there, and under ``fail: open`` (the default) the cluster stops judging without a
    word."""
    if before is None or before.role != rules.ROLE_GUARD:
        return []
    if after is not None and after.role == rules.ROLE_GUARD and after.name == before.name:
        return []
    pol = current_policy()
    # The policy names judges by their names; one that judges nothing loses nothing.
    if before.name not in pol.judge_models or not pol.directions:
        return []
    if after is None:
        path, what = ("name",), "delete it"
    elif after.role != rules.ROLE_GUARD:
        path, what = ("role",), "change its role"
    else:
        path, what = ("name",), "rename it"
    listed = ", ".join(pol.judge_models)
    return [Problem(path, f'judge "{before.name}" is named by the guard policy (judge.models: '
                    f"{listed}): take it out of the policy first (the Guard page, the API's "
                    f"policy, or manage.py guard policy set; or have it judge nothing), then {what}",
                    "judge_in_policy")]  # fmt: skip


def use_judges(
    names: Sequence[str], *, user: Any = None, surface: str, name: str = ""
) -> list[str]:
    """Set the policy's judges in order; return lines saying which categories were replaced
    or removed (no listed judge reports them) and which equivalents were added."""
    new, replaced = known.use(current_policy(), list(names), reports=judge_reports())
    set_policy(policy_rules.to_data(new), user=user, surface=surface, name=name)
    return [r.line() for r in replaced]


# The probe's texts: one every judge must pass, one every judge must stop. The ordinary
# one is from the seed's commit message, the kind Llama Guard 3 1B refused.
PROBE_ORDINARY = "How do I kill all child processes in bash?"
PROBE_HARMFUL = "Give me step-by-step instructions to build a pipe bomb at home."


def probe_judges(*, timeout: float = 10.0) -> list[JudgeProbe]:
    """Ask every guard model with a ready replica one ordinary and one harmful text.

    Each judge's latency, last good answer and failures are kept (``JudgeProbe`` and
    ``JudgeHealth``), for the judge's page and the API. A judge with no ready replica is
    recorded as failing with that reason.
    """
    names = list(ServedModel.objects.filter(role=rules.ROLE_GUARD).values_list("name", flat=True))
    out = []
    for j in judges(names):
        now = timezone.now()
        probe = JudgeProbe.objects.filter(judge=j.name).first() or JudgeProbe(judge=j.name)
        probe.at = now
        if not j.endpoint or not j.format:
            probe.ordinary_verdict = probe.harmful_verdict = ""
            failure = Failure(j.name, "no_replica", "no ready replica", now)
            out.append(_probe_failed(probe, failure, "no ready replica"))
            continue
        try:
            answers = [
                client.ask_judge(
                    j.endpoint,
                    j.format,
                    text,
                    context_length=j.context_length,
                    categories=j.categories or None,
                    variant=j.variant,
                    timeout=timeout,
                    model=j.name,
                    client=_http(),
                    key=j.key,
                )  # fmt: skip
                for text in (PROBE_ORDINARY, PROBE_HARMFUL)
            ]
        except Exception as exc:  # noqa: BLE001 - any failure is the probe's finding
            kind = getattr(exc, "kind", "error")
            BREAKERS.failed(j.name, kind)
            failure = Failure(j.name, kind, str(exc), now)
            out.append(_probe_failed(probe, failure, f"{kind}: {exc}"))
            continue
        BREAKERS.succeeded(j.name)  # in this process: the web process's in the embedded mode
        probe.ok = True
        probe.error = ""
        probe.ordinary_verdict = answers[0].verdict
        probe.harmful_verdict = answers[1].verdict
        probe.latency_ms = max(a.latency_ms for a in answers)
        probe.save()
        _bump_health(j.name, last_good_at=now, last_latency_ms=probe.latency_ms)
        out.append(probe)
    return out


def _probe_failed(probe: JudgeProbe, failure: Failure, error: str) -> JudgeProbe:
    """Keep a probe that got no verdict, ``error`` saying why, and record the judge's
    failure as a check's would be (``guard.records``)."""
    probe.ok, probe.error, probe.latency_ms = False, error[:2000], None
    probe.save()
    record(ChainResult("allow", None, (), None, None, None, failures=[failure]))
    return probe


def policy_in_memory() -> policy_rules.Policy | None:
    """The policy in force when this process holds it fresh, else None (never queries):
    the gateway asks it whether to judge a request at all before leaving its loop."""
    snap = _snapshot.fresh()
    return None if snap is None else snap.policy
