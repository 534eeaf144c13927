"""Client keys' operations (console, API and the ``gateway key`` command share them)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from catalog.models import Adapter, Alias, ServedModel
from cluster.services import log_action
from gateway.models import ClientKey, digest, new_secret


class KeyRefused(ValueError):
    """A key operation refused, with what to do."""


def create_key(
    name: str,
    *,
    owner: str = "",
    models: Sequence[str] = (),
    expires: datetime | None = None,
    rpm: int = 0,
    tpm: int = 0,
    user: Any = None,
    via: str = "",
) -> tuple[ClientKey, str]:
    """Make a key; return it with its secret, which is never stored or logged."""
    models = list(dict.fromkeys(models))  # a name given twice is kept once
    unknown = []
    for m in models:
        if not (
            ServedModel.objects.filter(name=m).exists()
            or Alias.objects.filter(name=m).exists()
            or Adapter.objects.filter(name=m).exists()
        ):
            unknown.append(m)
    if unknown:
        raise KeyRefused(
            f"models: {', '.join(unknown)} not in the catalog (name models, aliases or adapters)"
        )
    # A judge by its name, an alias or an adapter: judges answer no client.
    guards = sorted(
        {
            *ServedModel.objects.filter(name__in=models, role="guard").values_list("name", flat=True),
            *Alias.objects.filter(name__in=models, model__role="guard").values_list("name", flat=True),
            *Adapter.objects.filter(name__in=models, model__role="guard").values_list("name", flat=True),
        },
        key=models.index,
    )  # fmt: skip
    if guards:
        raise KeyRefused(f"models: {', '.join(guards)} judge traffic; no client key may name one")
    secret = new_secret()
    key = ClientKey(
        name=name, owner=owner, models=list(models), expires=expires, rpm=rpm, tpm=tpm,
        prefix=secret[len("llmgw-ck-"):][:8], digest=digest(secret),
        created_by=user if getattr(user, "pk", None) else None,
    )  # fmt: skip
    key.full_clean()
    with transaction.atomic():
        key.save()
        log_action(user, "client key create", name, f"owner {owner or '-'}", via)
    return key, secret


def revoke_key(name: str, *, user: Any = None, via: str = "") -> ClientKey:
    key = ClientKey.objects.filter(name=name, revoked__isnull=True).first()
    if key is None:
        raise KeyRefused(f"no live client key named {name!r} (gateway key list shows them)")
    with transaction.atomic():
        key.revoked = timezone.now()
        key.save(update_fields=["revoked"])
        log_action(user, "client key revoke", name, "", via)
    return key
