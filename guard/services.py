"""The guard policy's services over the database: the policy in force, checked and
completed as every surface saves it (``prepare_policy``, ``save_policy``, ``set_policy``,
``use_judges``), the judges a policy may name (``judge_reports``), a known judge added
to the catalog (``enable_judge``), and the judges' probes (``probe_judges``).

Used by the guard API, the console, the admin, the ``guard`` command and ``init``. The
rules are the pure modules': ``guard.policy`` (what a policy may say, what a verdict
decides), ``guard.chain`` (judges in turn), ``guard.client`` (asking one judge),
``guard.known`` (judges llmgw knows). What a check reads is ``guard.snapshots``; the
check itself ``guard.checks``; what the reconciler and the catalog's signals call,
``guard.hooks``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog import codec, rules
from catalog import services as catalog_services
from catalog.models import ServedModel
from catalog.problems import Problem
from cluster import wake
from cluster.choices import NodeHealth
from cluster.models import Card, Node
from guard import client, formats, known
from guard import policy as policy_rules
from guard.chain import ChainResult, Failure
from guard.checks import BREAKERS, PROBE_HARMFUL, PROBE_ORDINARY, connections, record
from guard.models import GuardPolicy, JudgeHealth, JudgeProbe, PolicyChange
from guard.snapshots import judges, snapshot
from llmgw_core.refused import Refused

log = logging.getLogger(__name__)


class PolicyRefused(Refused):
    """A policy the rules refuse; nothing was written."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(f"{p.field}: {p.message}" for p in problems))
        self.problems = list(problems)


def current_policy() -> policy_rules.Policy:
    """Return the policy in force: the stored one, or the built-in baseline, as its
    judges hold it (``guard.snapshots``).

    From the snapshot (``guard.snapshots.snapshot``): inside a transaction, as that
    transaction sees it.
    """
    return snapshot().policy


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


def _bump_health(judge: str, **changes: Any) -> None:
    if not JudgeHealth.objects.filter(judge=judge).update(**changes):
        JudgeHealth.objects.get_or_create(judge=judge)
        JudgeHealth.objects.filter(judge=judge).update(**changes)


def cluster_shape() -> tuple[list[int], dict[str, int]]:
    """Return the ready nodes' core counts and each GPU class's largest memory (MiB)."""
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
    cores, classes = cluster_shape()
    spec = known.enable_spec(name, gpu=gpu, node_cores=cores, gpu_classes=classes, sim=sim)
    existing = ServedModel.objects.filter(name=spec.name).first()
    if existing is not None:
        before = codec.encode_model(rules.normalize(existing.to_spec()))
        if before == codec.encode_model(rules.normalize(spec)):
            return spec.name, False
    catalog_services.save_model(spec, actor, replacing=spec.name if existing else None)
    return spec.name, True


def use_judges(
    names: Sequence[str], *, user: Any = None, surface: str, name: str = ""
) -> list[str]:
    """Set the policy's judges in order; return lines saying which categories were replaced
    or removed (no listed judge reports them) and which equivalents were added."""
    new, replaced = known.use(current_policy(), list(names), reports=judge_reports())
    set_policy(policy_rules.to_data(new), user=user, surface=surface, name=name)
    return [r.line() for r in replaced]


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
                    client=connections(),
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
