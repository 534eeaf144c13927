"""A done fetch written into the catalog: the model's ``origin`` (its commit and files)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from catalog import spec
from catalog.choices import Surface
from catalog.services import Actor, Refused, save_model, stored_queryset
from updates import registry
from updates.models import Fetch, UpdateRun, UpdateState

log = logging.getLogger(__name__)


# -- the origin --------------------------------------------------------------------------------


def origin_files(state: registry.RepoState) -> list[Any]:
    """Return a state's weights files, and its code files (compared for a model that trusts
    remote code), as the catalog's origin records them."""
    return [
        spec.OriginFile(path=f.path, sha256=f.sha256, bytes=int(f.size or 0))
        for f in state.compared(code=True)
    ]


def write_origin(fetch: Fetch, state: registry.RepoState) -> bool:
    """Write a model's ``origin`` from what the registry said of a done fetch, through the
    catalog's services (checked, logged with who asked for the fetch). Only a model with no
    origin yet, or at that commit, is written, and never from a running update's fetch
    (the update's promote writes it); True when written."""
    with transaction.atomic():
        row = stored_queryset().select_for_update().filter(name=fetch.model).first()
        if row is None:
            return False
        m = row.to_spec()
        if str(m.source or "").strip() != fetch.source:
            return False  # its source changed since: the fetch is not of it
        old = m.origin
        if old is not None and old.revision and old.revision != state.commit:
            return False  # the update's promote moves a model, not a fetch
        if (old is None or not old.revision) and _for_update(fetch):
            # An update's new revision, of a model never fetched: its origin is what serves,
            # written at the update's promote, not while the update is at its eval.
            return False
        repo = fetch.source if registry.kind(fetch.source) == "hf" else ""
        new = spec.Origin(
            repo=repo,
            revision=state.commit,
            files=origin_files(state),
            previous=old.previous if old is not None else None,
        )
        if old == new:
            return False
        m.origin = new
        actor = Actor(
            user=None,
            surface=Surface.UPDATES,
            name="mirror",
            via=fetch.requested_by or "",
        )
        try:
            save_model(m, actor, replacing=fetch.model, note=f"fetched at {state.commit[:8]}")
        except Refused as exc:
            log.warning("the catalog refused %s's origin: %s", fetch.model, exc)
            return False
    return True


def _for_update(fetch: Fetch) -> bool:
    """Return whether a fetch is a running update's (its new revision)."""
    return UpdateRun.objects.filter(
        fetch_id=fetch.pk, model=fetch.model, state__in=(UpdateState.RUNNING, UpdateState.WAITING)
    ).exists()
