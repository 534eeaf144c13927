"""The update check, pure: a model's origin against its repository's state, file by file.

No Django and no network here: ``compare`` is a function of plain data (the origin's
weights files and the registry's), tested with hypothesis. Weights whose sha256 changed,
weights added and weights removed are an update; a commit that changed none of them (a
README, a config the engine does not read) is not, whatever its commit id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

CURRENT = "current"
AVAILABLE = "available"
ERROR = "error"


@dataclass(frozen=True)
class Weights:
    """One weights file as the origin recorded it or the registry published it.

    ``blob_id`` is git's object id of a file kept in git itself rather than LFS (a small
    weights file such as the sim's ``sim-weights.json``): the registry gives no sha256 for
    it, so the mirror's copy's blob id is compared with the registry's.
    """

    path: str
    sha256: str = ""
    bytes: int = 0
    blob_id: str = ""


@dataclass(frozen=True)
class Result:
    """What a check found: the line ``catalog update check --json`` prints, as data."""

    model: str
    state: str
    revision: str = ""
    latest: str = ""
    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    message: str = ""

    def as_json(self) -> dict[str, Any]:
        """Return the result as the JSON object the command and the API answer."""
        return asdict(self)


def compare(
    model: str,
    revision: str,
    have: Iterable[Weights],
    latest: str,
    published: Iterable[Weights],
) -> Result:
    """Compare the weights a model has (its origin) with those the registry publishes.

    A file is "changed" when both sides give a sha256 and they differ, else when both
    give a git blob id and they differ, else when both give a size and it differs (a file
    with none of them is taken as unchanged: nothing says it changed).
    """
    mine = {w.path: w for w in have}
    theirs = {w.path: w for w in published}
    added = sorted(set(theirs) - set(mine))
    removed = sorted(set(mine) - set(theirs))
    changed = sorted(p for p in set(mine) & set(theirs) if _differs(mine[p], theirs[p]))
    if changed or added or removed:
        parts = [
            f"{len(v)} {k}"
            for k, v in (("changed", changed), ("added", added), ("removed", removed))
            if v
        ]
        return Result(
            model,
            AVAILABLE,
            revision,
            latest,
            changed,
            added,
            removed,
            f"weights at {short(latest)}: {', '.join(parts)}",
        )
    if latest and revision and latest != revision:
        message = f"{short(latest)} changed no weights file: not an update"
    else:
        # The badge says "up to date": the message says at what.
        message = f"at {short(revision)}, the newest" if revision else "at the newest revision"
    return Result(model, CURRENT, revision, latest, message=message)


def unfetched(model: str, source: str, latest: str, published: Iterable[Weights]) -> Result:
    """Return the check of a model never fetched (no origin): the registry's newest revision
    is there to fetch, with every weights file of it new to the model."""
    files = sorted(w.path for w in published)
    n = len(files)
    return Result(
        model,
        AVAILABLE,
        "",
        latest,
        added=files,
        message=(
            f"never fetched: {short(latest)} is the newest revision of {source}, {n} weights "
            f"file{'s' if n != 1 else ''}: fetch it now (the mirror's Fetch now, or Update)"
        ),
    )


def error(model: str, revision: str, message: str) -> Result:
    """Return a check that could not be made, with why."""
    return Result(model, ERROR, revision, message=message)


def _differs(a: Weights, b: Weights) -> bool:
    if a.sha256 and b.sha256:
        return a.sha256.lower() != b.sha256.lower()
    if a.blob_id and b.blob_id:
        return a.blob_id.lower() != b.blob_id.lower()
    if a.bytes and b.bytes:
        return a.bytes != b.bytes
    return False


def short(revision: str) -> str:
    """Return a commit as a person writes it (its first 8 characters)."""
    return revision[:8] if len(revision) > 8 else revision
