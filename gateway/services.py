"""Client keys' operations (console, API and the ``gateway key`` command share them), and
the control plane's own keys pinned to a replica (the capacity bench's: ``pinned_key``)."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from catalog.models import Adapter, Alias, ServedModel
from cluster.services import log_action
from gateway.models import ClientKey, new_secret
from gateway.path.table import digest
from llmgw_core.refused import Refused

MAX_LIMIT = 1_000_000_000


class KeyRefused(Refused, ValueError):
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
    replica: int | None = None,
    user: Any = None,
    via: str = "",
) -> tuple[ClientKey, str]:
    """Make a key; return it with its secret, which is never stored or logged.

    The console, the API and the ``gateway key`` command call this; a refusal is
    ``KeyRefused`` naming the field. ``replica`` pins the key to one replica: the
    control plane's own keys only (``pinned_key``); no form, serializer or command
    passes it.
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
        priority=priority, replica=replica, prefix=secret[len("llmgw-ck-"):][:8],
        digest=digest(secret), created_by=user if getattr(user, "pk", None) else None,
    )  # fmt: skip
    pinned = f", pinned to replica #{replica}" if replica is not None else ""
    try:
        key.full_clean()
        with transaction.atomic():
            key.save()
            log_action(
                user, "client key create", name,
                f"owner {owner or '-'}, priority {priority}{pinned}", via,
            )  # fmt: skip
    except ValidationError as error:
        found: dict[str, list[str]] = {}
        for field, messages in error.message_dict.items():
            found.setdefault("" if field == "__all__" else field, []).extend(messages)
        raise KeyRefused(found) from None
    except IntegrityError:
        raise KeyRefused({"": ["a live client key already has that name"]}) from None
    return key, secret


# A pinned key not revoked by its run (its process killed) stops working after this.
PINNED_FOR = timedelta(hours=6)


@contextlib.contextmanager
def pinned_key(model: str, replica: int, *, user: Any = None, via: str = "") -> Iterator[str]:
    """A client key for one run of the control plane (the capacity bench), yielding its
    secret: it names ``model`` alone and is pinned to ``replica`` (the gateway sends its
    requests there only: no other replica, no canary, no fallback, 503 naming the replica
    when it is not in routing), in the top band (admission neither holds it nor counts its
    deliberate overload against the model's slo), with no owner (no quota, no token
    budget). Revoked when the run ends, however it ends; one whose
    process was killed expires after ``PINNED_FOR``.

    Registered with the cluster's bench by the gateway's ``ready()`` (the cluster imports
    no gateway): ``cluster.benchrun.use_pinned_keys``.
    """
    name = f"bench-replica-{replica}-{secrets.token_hex(3)}"
    _, secret = create_key(name, models=[model], priority="high", replica=replica,
                           expires=timezone.now() + PINNED_FOR, user=user, via=via)  # fmt: skip
    try:
        yield secret
    finally:
        with contextlib.suppress(KeyRefused):  # revoked already (by an operator)
            revoke_key(name, user=user, via=via)


def revoke_key(name: str, *, user: Any = None, via: str = "") -> ClientKey:
    key = ClientKey.objects.filter(name=name, revoked__isnull=True).first()
    if key is None:
        raise KeyRefused({"": [f"no live client key named {name!r} (gateway key list shows them)"]})
    with transaction.atomic():
        key.revoked = timezone.now()
        key.save(update_fields=["revoked"])
        log_action(user, "client key revoke", name, "", via)
    return key
