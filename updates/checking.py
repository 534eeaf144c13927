"""The update check's shell: each model with a registry compared with it.

``check_models(names, by=...)`` asks the registry (``updates.registry.latest``) for the
revision each model pins, or the newest, compares the weights file by file
(``updates.check.compare``, pure), keeps the result (``UpdateCheck``, one row a model) and
marks the model live. A registry that fails is that model's ``error`` with the reason: the
others are checked, and nothing of the catalog changes.

While a model's check runs (a registry can take up to ``registry.TIMEOUT_S`` to answer), a
mark in the cache (Redis in production, shared by every process) says so: the Updates page
and the model's panel show it "checking" (``checking_now``), pushed live at its start. The
mark expires by itself (``CHECKING_MARK_S``), so a process that dies mid-check leaves none.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.core.cache import cache
from django.utils import timezone

from catalog.services import stored_specs
from llmgw_core import events
from updates import check, mirror, registry
from updates.models import UpdateCheck

log = logging.getLogger(__name__)

# How long a "checking" mark lives at most: a check asks the registry once, bounded by
# its timeout; the margin covers the library's own retries.
CHECKING_MARK_S = int(registry.TIMEOUT_S * 3)
_MARK = "updates:checking:"


def checkable(m: object) -> bool:
    """Return whether a model can be checked: its source has a registry (one never fetched,
    with no origin yet, is checked against the registry's newest revision too)."""
    return registry.kind(str(getattr(m, "source", "") or "")) is not None


def check_model(m: object) -> check.Result:
    """Check one model (a catalog spec); never raises for the registry's failures."""
    name = str(getattr(m, "name", ""))
    origin = getattr(m, "origin", None)
    source = str(getattr(m, "source", "") or "").strip()
    if registry.kind(source) is None:
        return check.error(
            name,
            origin.revision if origin is not None else "",
            f"source {source or '(none)'} has no registry to check (a local path)",
        )
    if origin is None or not origin.revision:
        # Never fetched (a sim engine's nodes need no weights, so nothing fetched them):
        # what the registry holds now is what a fetch would take.
        try:
            state = registry.latest(source, None)
        except registry.RegistryError as exc:
            return check.error(name, "", f"never fetched, and {exc}")
        return check.unfetched(
            name,
            source,
            state.commit,
            [check.Weights(f.path, f.sha256, int(f.size or 0), f.blob_id) for f in state.weights],
        )
    have = _have(name, origin)
    try:
        # The newest revision: a model's origin records the commit it was fetched at, which
        # is what is compared, not what is asked for.
        state = registry.latest(source, None)
    except registry.RegistryError as exc:
        return check.error(name, origin.revision, str(exc))
    # Code files count for a model that runs them (trust_remote_code), weights for all.
    code = bool(getattr(m, "trust_remote_code", False))
    have = [w for w in have if registry.kind(source) == "url" or registry.is_compared(w.path, code)]
    published = [
        check.Weights(f.path, f.sha256, int(f.size or 0), f.blob_id) for f in state.compared(code)
    ]
    return check.compare(name, origin.revision, have, state.commit, published)


def _have(name: str, origin: object) -> list[check.Weights]:
    """Return the origin's weights files; one the registry keeps in git (no sha256 in the
    origin) with the git blob id of the mirror's copy when the mirror holds it."""
    files = list(getattr(origin, "files", ()))
    folder = None
    if any(not f.sha256 for f in files):
        try:
            folder = mirror.local_path(name, str(getattr(origin, "revision", "") or ""))
        except Exception:  # no mirror to look into: compared by size, as before
            log.debug("looking up %s's mirror folder failed", name, exc_info=True)
    have = []
    for f in files:
        blob_id = ""
        if not f.sha256 and folder is not None:
            path = folder / f.path
            if path.is_file():
                blob_id = mirror.git_blob_id(path)
        have.append(check.Weights(f.path, f.sha256, f.bytes, blob_id))
    return have


def check_models(names: Iterable[str] | None = None, *, by: str = "") -> list[check.Result]:
    """Check the models named (every model with an origin for None); keep each result.

    A model named that is not in the catalog is an ``error`` result saying so.
    """
    wanted = None if names is None else list(dict.fromkeys(names))
    specs = stored_specs(names=wanted)
    found = {m.name: m for m in specs}
    results = []
    for name in wanted if wanted is not None else [m.name for m in specs if checkable(m)]:
        m = found.get(name)
        if m is None:
            results.append(check.error(name, "", f'model "{name}" is not in the catalog'))
            continue
        _mark_checking(name, by)
        try:
            result = check_model(m)
            results.append(result)
            _keep(result, by)
        finally:
            _unmark_checking(name)
    return results


def _mark_checking(name: str, by: str) -> None:
    try:
        cache.set(_MARK + name, by or "-", timeout=CHECKING_MARK_S)
    except Exception:  # no cache to say it in: the check runs all the same
        log.debug("marking %s as checking failed", name, exc_info=True)
        return
    _changed(name)


def _unmark_checking(name: str) -> None:
    try:
        cache.delete(_MARK + name)
    except Exception:
        log.debug("unmarking %s as checking failed", name, exc_info=True)


def checking_now(names: Iterable[str]) -> set[str]:
    """Return which of the models named are being checked now (empty when the cache
    cannot say: a page shows their last check instead)."""
    keys = {_MARK + n: n for n in names}
    if not keys:
        return set()
    try:
        found = cache.get_many(list(keys))
    except Exception:
        log.debug("reading the checking marks failed", exc_info=True)
        return set()
    return {keys[k] for k in found}


def _changed(name: str) -> None:
    try:
        events.changed(models=[name])
    except Exception:
        log.debug("marking %s changed failed", name, exc_info=True)


def _said(result: check.Result) -> dict[str, object]:
    """Return what a check found, as its row keeps it."""
    return {
        "state": result.state,
        "revision": result.revision,
        "latest": result.latest,
        "changed": result.changed,
        "added": result.added,
        "removed": result.removed,
        "message": result.message[:4000],
    }


def _keep(result: check.Result, by: str) -> None:
    UpdateCheck.objects.update_or_create(
        model=result.model,
        defaults={**_said(result), "checked": timezone.now(), "checked_by": by[:300]},
    )
    _changed(result.model)


def moved(name: str, before: object, after: object) -> None:
    """Make a model's last check true again once it moved to other weights (an update
    promoted, a rollback), without asking the registry: the check said which revision is
    the newest (``latest``), and the origins before and after (catalog specs' ``origin``)
    say what each holds. Moved to the newest, it is current; moved back from it, what the
    newest changes is compared with what the model holds now. A check whose newest is
    neither stays as it was until the next check. When it was checked, and by whom, stay.
    """
    last = UpdateCheck.objects.filter(model=name).first()
    now_at = str(getattr(after, "revision", "") or "")
    if last is None or not last.latest or not now_at:
        return
    if last.latest == now_at:
        held = _have(name, after)
        result = check.compare(name, now_at, held, now_at, held)
    elif last.latest == str(getattr(before, "revision", "") or ""):
        result = check.compare(name, now_at, _have(name, after), last.latest, _have(name, before))
    else:
        return
    UpdateCheck.objects.filter(pk=last.pk).update(**_said(result))
    _changed(name)


def last_checks(names: Iterable[str] | None = None) -> dict[str, UpdateCheck]:
    """Return the last check of each model (of those named), by name."""
    q = UpdateCheck.objects.all()
    if names is not None:
        q = q.filter(model__in=list(names))
    return {c.model: c for c in q}
