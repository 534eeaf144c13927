"""Quotas as stored (``cluster.models.Quota``): set and removed through one path (the
console, the API, the admin and ``manage.py cluster quota`` call it; logged with who and
through what), the book placement reads (``cluster.quotas.Book``), and what each owner's
replicas hold now (the console's and the API's figures)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from cluster import quotas, wake
from cluster.models import Assignment, Card, Quota, Replica
from cluster.services import log_action
from llmgw_core.refused import Refused


class QuotaRefused(Refused, ValueError):
    """A quota not written: ``errors`` by field, nothing changed."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def _wake() -> None:
    """The reconciler ticks soon: a replica waiting on a quota may place now."""
    wake.reconcile_soon()


def set_quota(
    owner: str,
    *,
    parent: str = "",
    cards: Mapping[str, int] | None = None,
    cpu_cores: int | None = None,
    tpm: int = 0,
    user: Any = None,
    via: str = "",
) -> Quota:
    """Write ``owner``'s quota (made or replaced whole); refused as ``QuotaRefused``."""
    q = Quota.objects.filter(owner=owner).first() or Quota(owner=owner)
    q.parent, q.cards, q.cpu_cores, q.tpm = parent, dict(cards or {}), cpu_cores, tpm
    try:
        q.full_clean()
    except ValidationError as error:
        raise QuotaRefused(
            {("owner" if k == "__all__" else k): list(v) for k, v in error.message_dict.items()}
        ) from None
    with transaction.atomic():
        q.save()
        log_action(user, "quota set", owner, describe(q), via)
    _wake()
    return q


def delete_quota(owner: str, *, user: Any = None, via: str = "") -> None:
    q = Quota.objects.filter(owner=owner).first()
    if q is None:
        raise QuotaRefused({"owner": [f"no quota for {owner!r} (cluster quota list shows them)"]})
    with transaction.atomic():
        q.delete()
        log_action(user, "quota removed", owner, "", via)
    _wake()


def describe(q: Quota) -> str:
    parts = [f"{n} {c}" for c, n in sorted(q.cards.items())]
    if q.cpu_cores is not None:
        parts.append(f"{q.cpu_cores} CPU cores")
    if q.tpm:
        parts.append(f"{q.tpm} tokens a minute")
    limits = ", ".join(parts) or "no limit"
    return f"{limits}; in {q.parent}" if q.parent else limits


def book(specs: Mapping[str, Any]) -> quotas.Book | None:
    """What placement reads: every quota, and each catalog model's owner; None with no
    quota at all (placement then counts nothing)."""
    rows = list(Quota.objects.all())
    if not rows:
        return None
    return quotas.Book(
        quotas={q.owner: quotas.Quota(q.owner, q.parent, dict(q.cards), q.cpu_cores) for q in rows},
        owners={name: getattr(m, "owner", "") or "" for name, m in specs.items()},
    )


def usage(owners: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """What each owner's placed replicas hold now, its children's included: {owner:
    {resource: n}}; ``owners`` is each model's owner."""
    rows = list(Quota.objects.all())
    b = quotas.Book({q.owner: quotas.Quota(q.owner, q.parent) for q in rows}, dict(owners))
    ledger = quotas.Ledger(b)
    classes = {
        (node, index): cls
        for node, index, cls in Card.objects.values_list("node__name", "index", "gpu_class")
    }
    held: dict[int, list[Assignment]] = {}
    for a in Assignment.objects.select_related("node"):
        held.setdefault(a.replica_id, []).append(a)
    for r in Replica.objects.filter(pk__in=list(held)).only("pk", "model_name"):
        shares = [_Share(a.node.name, tuple(a.cards), a.cpu_cores) for a in held[r.pk]]
        ledger.take(r.model_name, *quotas.held_by(shares, classes))
    return ledger.usage()


class _Share:
    __slots__ = ("node", "cards", "cpu_cores")

    def __init__(self, node: str, cards: tuple[int, ...], cpu_cores: int) -> None:
        self.node, self.cards, self.cpu_cores = node, cards, cpu_cores


def parse_cards(values: list[str]) -> dict[str, int]:
    """``CLASS=N`` as the command and the console's form take them; ValueError says which."""
    out: dict[str, int] = {}
    for v in values:
        cls, sep, n = v.strip().partition("=")
        if not sep or not cls.strip() or not n.strip().isdigit():
            raise ValueError(f"{v!r} is not CLASS=N (a GPU class, =, a whole number of cards)")
        out[cls.strip()] = int(n)
    return out
