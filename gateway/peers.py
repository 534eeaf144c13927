"""Federated peers' operations (the ``federation`` command, the API and the admin share
them) and the refresh the reconciler's tick runs (``gateway.signals``).

A refresh reads the peer's ``/v1/models`` with its key and ``x-llmgw-via`` (at most
``LLMGW_FEDERATION_TIMEOUT`` seconds), writes the catalog's ``PEER/MODEL`` entries
through ``catalog.services`` (so the change log, the export and every surface see them)
and keeps the peer's breaker (``gateway.path.federation.probed``): a failed read is a failed
probe. Every operator's change is recorded with who made it (the cluster's action log).
A peer added or removed, and a refresh that changes a peer's state, last error or models,
marks the live ``peers`` event (``llmgw_core.events``): the consoles' peers panels update.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog import services as catalog
from catalog.choices import Surface
from catalog.models import ServedModel
from catalog.rules import environment
from cluster.services import log_action
from gateway.models import Peer
from gateway.path import federation, providers
from llmgw_core import events
from llmgw_core.refused import Refused

log = logging.getLogger("gateway")


class PeerRefused(Refused, ValueError):
    """A peer operation refused, nothing written: ``errors`` by field ("": the peer)."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(
            "; ".join(f"{k}: {' '.join(v)}" if k else " ".join(v) for k, v in errors.items())
        )
        self.errors = errors


def thresholds() -> federation.Thresholds:
    return federation.Thresholds(
        errors=settings.LLMGW_FEDERATION_TRIP_ERRORS,
        window=float(settings.LLMGW_FEDERATION_TRIP_WINDOW),
        probes=settings.LLMGW_FEDERATION_RECOVER_PROBES,
        dwell=float(settings.LLMGW_FEDERATION_DWELL),
    )


def _actor(peer: str) -> catalog.Actor:
    return catalog.Actor(user=None, surface=Surface.GATEWAY, name=f"federation {peer}")


def problems(name: str, url: str, key_file: str) -> dict[str, list[str]]:
    """What stops a peer being added, by field (empty: nothing): the name, the url, the
    key file (the rules of an external provider's), a name the catalog's models use."""
    errors: dict[str, list[str]] = {}
    why = federation.name_problem(name)
    if why:
        errors["name"] = [why]
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        errors["url"] = [f"url {url!r} is not an http(s) address: give the peer's, like "
                         "https://llmgw.east.example"]  # fmt: skip
    else:
        why = environment.url_problem(url, frozenset(settings.LLMGW_EXTERNAL_HTTP_HOSTS))
        if why:
            errors["url"] = [f"url {url!r} {why}"]
    _, why = environment.key_file(key_file or "", settings.LLMGW_SECRETS_DIR)
    if why:
        errors["key_file"] = [f"key file {key_file!r} {why}"]
    if "name" not in errors:
        if Peer.objects.filter(name=name).exists():
            errors["name"] = [f"a peer named {name!r} is already added"]
        elif (
            ServedModel.objects.filter(name__startswith=f"{name}/")
            .exclude(external_peer=name)
            .exists()
        ):
            errors["name"] = [f"the catalog has models named {name}/…: choose another peer name"]
    return errors


def add_peer(name: str, url: str, key_file: str, *, user: Any = None, via: str = "") -> Peer:
    """Record a peer (its models arrive with the next refresh); ``PeerRefused`` naming the
    field when the name, the url or the key file is not allowed."""
    errors = problems(name, url, key_file)
    if errors:
        raise PeerRefused(errors)
    try:
        with transaction.atomic():
            peer = Peer.objects.create(
                name=name, url=url, api_key_file=key_file,
                created_by=user if getattr(user, "pk", None) else None,
            )  # fmt: skip
            log_action(user, "federation add", name, url, via)
            events.changed(peers=[name])
    except IntegrityError:
        raise PeerRefused({"name": [f"a peer named {name!r} is already added"]}) from None
    return peer


def remove_peer(name: str, *, user: Any = None, via: str = "") -> list[str]:
    """Remove a peer and its models from the catalog; return the models removed."""
    peer = Peer.objects.filter(name=name).first()
    if peer is None:
        raise PeerRefused({"": [f"no peer named {name!r} (federation list shows them)"]})
    removed = []
    try:
        with transaction.atomic():
            for model in ServedModel.objects.filter(external_peer=name).values_list(
                "name", flat=True
            ):
                catalog.delete_model(model, _actor(name))
                removed.append(model)
            peer.delete()
            log_action(user, "federation remove", name, f"{len(removed)} models removed", via)
            events.changed(peers=[name])
    except catalog.Refused as refused:
        # Another model names one of the peer's (a fallback, a canary): nothing removed.
        raise PeerRefused(
            {"": [f"peer {name!r} is kept: {refused}; change that model first"]}
        ) from None
    return removed


@dataclass(frozen=True)
class Read:
    """What one read of a peer's ``/v1/models`` found: its model ids, or why it failed."""

    models: list[str]
    error: str = ""


def read_models(peer: Peer, timeout: float | None = None) -> Read:
    """Ask the peer for its ``/v1/models`` with its key, at most ``timeout`` seconds."""
    probe = federation.peer_model(peer.name, peer.url, peer.api_key_file, "-")
    try:
        secret = providers.key(probe)
    except providers.ProviderRefused as refused:
        return Read([], refused.why)
    limit = settings.LLMGW_FEDERATION_TIMEOUT if timeout is None else timeout
    headers = {"authorization": f"Bearer {secret}"} if secret else {}
    # As a request sent to the peer says it (gateway.path.routing): the peer lists only what it
    # offers another cluster, whatever the key (no local model, none it learned).
    headers[federation.VIA] = federation.VIA_VALUE
    try:
        resp = httpx.get(federation.models_url(peer.url), headers=headers, timeout=limit)
    except httpx.TimeoutException:
        return Read([], f"no answer within {limit:g} s")
    except httpx.HTTPError as error:
        return Read([], f"not reached: {error}")
    if resp.status_code != 200:
        return Read([], f"its /v1/models answered {resp.status_code}")
    try:
        body = resp.json()
    except ValueError:
        return Read([], "its /v1/models answer is not JSON")
    models, why = federation.listed_models(body)
    return Read(models, why)


def refresh(peer: Peer, now: float | None = None, read: Read | None = None) -> federation.Plan:
    """Read the peer once, keep its breaker, and write its models' changes to the catalog.

    While a read fails the peer's models stay in the catalog (the breaker keeps them
    from being listed or sent to); a successful read adds and removes them.
    """
    now = time.time() if now is None else now
    got = read_models(peer) if read is None else read
    ok = not got.error
    # What the peers' panel shows (gateway.live): pushed when a read changes it.
    shown = (peer.state, peer.last_error, peer.passes, list(peer.listed or ()))
    before = federation.Health(peer.state, tuple(peer.failures or ()), peer.tripped_at, peer.passes)
    health = federation.probed(before, ok, now, thresholds())
    if health.state != before.state:
        log.warning("federation: peer %s is %s%s", peer.name, health.state,
                    f" ({got.error})" if got.error else "")  # fmt: skip
    peer.state, peer.failures = health.state, list(health.failures)
    peer.tripped_at, peer.passes = health.since, health.passes
    peer.last_error = got.error
    peer.refreshed = timezone.now()
    change = federation.Plan()
    if ok:
        peer.listed = got.models
        names = ServedModel.objects.filter(external_peer=peer.name).values_list("name", flat=True)
        existing = catalog.stored_specs(names=list(names))
        change = federation.plan(peer.name, peer.url, peer.api_key_file, got.models, existing)
        _write(peer.name, change)
    peer.save(update_fields=["state", "failures", "tripped_at", "passes", "last_error",
                             "listed", "refreshed"])  # fmt: skip
    if (peer.state, peer.last_error, peer.passes, list(peer.listed or ())) != shown:
        events.changed(peers=[peer.name])  # what the peers' panel shows changed
    return change


def _write(peer: str, change: federation.Plan) -> None:
    """Write a refresh's changes, each through the catalog's services (one refused is
    logged and skipped: the others still apply)."""
    actor = _actor(peer)
    for m in change.add:
        _apply(lambda m=m: catalog.save_model(m, actor), m.name)
    for m in change.change:
        _apply(lambda m=m: catalog.save_model(m, actor, replacing=m.name), m.name)
    for name in change.remove:
        _apply(lambda name=name: catalog.delete_model(name, actor), name)


def _apply(write: Any, name: str) -> None:
    try:
        write()
    except catalog.Refused as refused:
        log.warning("federation: %s not written: %s", name, refused)


def refresh_due(now: float | None = None) -> list[str]:
    """Refresh every peer not read in the last ``LLMGW_FEDERATION_REFRESH`` seconds (the
    reconciler's tick calls this); return the peers read."""
    every = timedelta(seconds=settings.LLMGW_FEDERATION_REFRESH)
    cutoff = timezone.now() - every
    done = []
    for peer in Peer.objects.all():
        if peer.refreshed is None or peer.refreshed <= cutoff:
            refresh(peer, now)
            done.append(peer.name)
    return done
