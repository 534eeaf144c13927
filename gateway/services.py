"""Client keys' operations (console, API and the ``gateway key`` command share them)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog.models import Adapter, Alias, ServedModel
from cluster.services import log_action
from gateway.models import ClientKey, digest, new_secret

MAX_LIMIT = 1_000_000_000


class KeyRefused(ValueError):
    """A key operation refused, nothing written: ``errors`` says what is wrong by field
    ("": the key as a whole, which the console's form and the API show at its name), its
    text what to do."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__(
            "; ".join(f"{k}: {' '.join(v)}" if k else " ".join(v) for k, v in errors.items())
        )
        self.errors = errors

    def by_field(self) -> dict[str, list[str]]:
        """Return the errors with the key's own under ``name``."""
        out: dict[str, list[str]] = {}
        for field, messages in self.errors.items():
            out.setdefault(field or "name", []).extend(messages)
        return out


def create_key(
    name: str,
    *,
    owner: str = "",
    models: Sequence[str] = (),
    expires: datetime | None = None,
    rpm: int = 0,
    tpm: int = 0,
    priority: str = "normal",
    user: Any = None,
    via: str = "",
) -> tuple[ClientKey, str]:
    """Make a key; return it with its secret, which is never stored or logged.

    The console, the API and the ``gateway key`` command call this; a refusal is
    ``KeyRefused`` naming the field.
    """
    errors: dict[str, list[str]] = {}
    if expires is not None and expires <= timezone.now():
        errors["expires"] = ["expires is in the past: give a later time, or none"]
    for field, value in (("rpm", rpm), ("tpm", tpm)):
        if not 0 <= value <= MAX_LIMIT:
            errors[field] = [f"{field} is 0 (no limit) up to {MAX_LIMIT}"]
    if priority not in ("high", "normal", "low"):
        errors["priority"] = [f"priority is {priority!r}: write high, normal or low"]
    if errors:
        raise KeyRefused(errors)
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
        why = f"{', '.join(unknown)} not in the catalog (name models, aliases or adapters)"
        raise KeyRefused({"models": [why]})
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
        raise KeyRefused(
            {"models": [f"{', '.join(guards)} judge traffic; no client key may name one"]}
        )
    secret = new_secret()
    key = ClientKey(
        name=name, owner=owner, models=list(models), expires=expires, rpm=rpm, tpm=tpm,
        priority=priority, prefix=secret[len("llmgw-ck-"):][:8], digest=digest(secret),
        created_by=user if getattr(user, "pk", None) else None,
    )  # fmt: skip
    try:
        key.full_clean()
        with transaction.atomic():
            key.save()
            log_action(
                user, "client key create", name, f"owner {owner or '-'}, priority {priority}", via
            )
    except ValidationError as error:
        found: dict[str, list[str]] = {}
        for field, messages in error.message_dict.items():
            found.setdefault("" if field == "__all__" else field, []).extend(messages)
        raise KeyRefused(found) from None
    except IntegrityError:
        raise KeyRefused({"": ["a live client key already has that name"]}) from None
    return key, secret


def revoke_key(name: str, *, user: Any = None, via: str = "") -> ClientKey:
    key = ClientKey.objects.filter(name=name, revoked__isnull=True).first()
    if key is None:
        raise KeyRefused({"": [f"no live client key named {name!r} (gateway key list shows them)"]})
    with transaction.atomic():
        key.revoked = timezone.now()
        key.save(update_fields=["revoked"])
        log_action(user, "client key revoke", name, "", via)
    return key
