"""Capacity quotas per owner, plain data and pure functions.

A catalog model's ``owner`` (``org:ID``, ``team:ID`` or ``project:ID``; empty: shared,
counted against nobody) is the part of the tenancy tree its replicas count against. A
quota names an owner, its parent (a project's team, a team's org: the tree is written in
the quotas, since an owner's name does not say it) and its limits: cards per GPU class,
and CPU cores for the profiles with no card. A limit not named is no limit; a quota of
0 cards of a class allows none.

``Book`` is what placement reads: the quotas, and each model's owner. ``Ledger`` counts
what the running replicas hold against each owner and every parent above it; a replica
fits when its cards (or cores) fit within the quota of its owner and of each parent.
When one does not, ``Ledger.refusal`` says which quota, in an operator's words: the
replica waits (pending) with that reason, another owner's model still places.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

LEVELS = ("org", "team", "project")
OWNER_RE = re.compile(r"^(org|team|project):[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
CPU = "cpu cores"  # the resource a CPU profile's cores count in


def level(owner: str) -> str:
    return owner.partition(":")[0]


def parent_level(owner: str) -> str | None:
    """The level an owner's parent is at: a project's is a team, a team's an org."""
    i = LEVELS.index(level(owner))
    return LEVELS[i - 1] if i else None


def check(
    owner: str, parent: str, cards: Mapping[str, int], cpu_cores: int | None
) -> dict[str, str]:
    """What is wrong with a quota, by field (empty: nothing)."""
    errors: dict[str, str] = {}
    if not OWNER_RE.match(owner or ""):
        errors["owner"] = (
            f"owner {owner!r} is not org:ID, team:ID or project:ID (letters, digits, '.', "
            "'_' and '-')"
        )
    elif parent:
        want = parent_level(owner)
        if not OWNER_RE.match(parent):
            errors["parent"] = f"parent {parent!r} is not org:ID or team:ID"
        elif want is None:
            errors["parent"] = f"{owner} is an org: it has no parent; leave parent empty"
        elif level(parent) != want:
            errors["parent"] = (
                f"the parent of a {level(owner)} is a {want}: write {want}:ID, not {parent}"
            )
    if not isinstance(cards, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, int) and not isinstance(v, bool) and v >= 0
        for k, v in cards.items()
    ):
        errors["cards"] = "cards are GPU class: count, each count 0 or more"
    if cpu_cores is not None and (isinstance(cpu_cores, bool) or cpu_cores < 0):
        errors["cpu_cores"] = "cpu_cores is 0 or more, or empty for no limit"
    return errors


@dataclass(frozen=True)
class Quota:
    owner: str
    parent: str = ""
    cards: Mapping[str, int] = field(default_factory=dict)
    cpu_cores: int | None = None

    def limit(self, resource: str) -> int | None:
        if resource == CPU:
            return self.cpu_cores
        return self.cards.get(resource)


@dataclass(frozen=True)
class Book:
    """The quotas by owner, and each catalog model's owner."""

    quotas: Mapping[str, Quota] = field(default_factory=dict)
    owners: Mapping[str, str] = field(default_factory=dict)

    def chain(self, owner: str) -> list[str]:
        """``owner`` and its parents, nearest first (a loop is cut where it closes)."""
        out: list[str] = []
        while owner and owner not in out:
            out.append(owner)
            q = self.quotas.get(owner)
            owner = q.parent if q else ""
        return out

    def owner_of(self, model: str) -> str:
        return self.owners.get(model, "")


def need_of(gpu_class: str, gpus_per_node: int, nodes: int, cpu_cores: int) -> tuple[str, int]:
    """What one replica of a profile counts: (GPU class, cards) or (``CPU``, cores)."""
    if gpu_class and gpus_per_node > 0:
        return gpu_class, gpus_per_node * max(1, nodes)
    return CPU, cpu_cores * max(1, nodes)


class Ledger:
    """What each owner holds now, per resource, its children's included."""

    def __init__(self, book: Book) -> None:
        self.book = book
        self.used: dict[tuple[str, str], int] = {}
        # (node, card index) -> GPU class, for what running replicas hold (placement's).
        self.classes: dict[tuple[str, int], str] = {}

    def take(self, model: str, resource: str, amount: int, sign: int = 1) -> None:
        if amount <= 0:
            return
        for owner in self.book.chain(self.book.owner_of(model)):
            k = (owner, resource)
            self.used[k] = self.used.get(k, 0) + sign * amount

    def give_back(self, model: str, resource: str, amount: int) -> None:
        self.take(model, resource, amount, -1)

    def refusal(self, model: str, resource: str, amount: int) -> str | None:
        """Why one more replica of ``model`` holding ``amount`` of ``resource`` would pass a
        quota (its owner's or a parent's, nearest first), or None when it fits."""
        if amount <= 0:
            return None
        for owner in self.book.chain(self.book.owner_of(model)):
            q = self.book.quotas.get(owner)
            limit = q.limit(resource) if q else None
            if limit is None:
                continue
            used = self.used.get((owner, resource), 0)
            if used + amount > limit:
                unit = "CPU cores" if resource == CPU else f"{resource} cards"
                whose = "" if owner == self.book.owner_of(model) else (
                    f" (above {self.book.owner_of(model)})"
                )  # fmt: skip
                return (
                    f"quota of {owner}{whose} spent: {used} of its {limit} {unit} in use, "
                    f"and a replica needs {amount}"
                )
        return None

    def usage(self) -> dict[str, dict[str, int]]:
        """By owner, what is in use per resource (the console's quota page)."""
        out: dict[str, dict[str, int]] = {}
        for (owner, resource), n in sorted(self.used.items()):
            out.setdefault(owner, {})[resource] = n
        return out


def quota_refusals(
    book: Book, running: Iterable[tuple[str, str, int]], wanted: Iterable[tuple[str, str, int]]
) -> list[str | None]:
    """For each wanted replica (model, resource, amount) in order, whether it fits after
    the running ones and the wanted ones before it that fit (None), or why not."""
    ledger = Ledger(book)
    for model, resource, amount in running:
        ledger.take(model, resource, amount)
    out: list[str | None] = []
    for model, resource, amount in wanted:
        why = ledger.refusal(model, resource, amount)
        if why is None:
            ledger.take(model, resource, amount)
        out.append(why)
    return out


def held_by(
    assignments: Iterable[object], classes: Mapping[tuple[str, int], str]
) -> tuple[str, int]:
    """What a running replica counts against its owner: its cards (by the class its
    nodes report for them) or, holding none, its CPU cores. ``assignments`` are
    placement's (``node``, ``cards``, ``cpu_cores``)."""
    cards: dict[str, int] = {}
    cores = 0
    for a in assignments:
        for index in getattr(a, "cards", ()):
            gpu_class = classes.get((getattr(a, "node", ""), index), "")
            cards[gpu_class] = cards.get(gpu_class, 0) + 1
        cores += getattr(a, "cpu_cores", 0)
    if cards:
        gpu_class, n = max(cards.items(), key=lambda kv: kv[1])
        return gpu_class, n
    return CPU, cores
