"""Client keys as the console, the API and the admin take them: one reading of a
request to make a key, and its refusals by field, over ``gateway.services``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError
from django.utils import timezone

from gateway import services
from gateway.models import ClientKey

MAX_LIMIT = 1_000_000_000


class FieldErrors(ValueError):
    """A key not made, with what is wrong by field."""

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


def create(
    *,
    name: str,
    owner: str = "",
    models: Sequence[str] = (),
    expires: datetime | None = None,
    rpm: int = 0,
    tpm: int = 0,
    user: Any = None,
    via: str,
) -> tuple[ClientKey, str]:
    """Make a key through the services; a refusal is ``FieldErrors`` naming the field."""
    errors: dict[str, list[str]] = {}
    if expires is not None and expires <= timezone.now():
        errors["expires"] = ["expires is in the past: give a later time, or none"]
    for field, value in (("rpm", rpm), ("tpm", tpm)):
        if not 0 <= value <= MAX_LIMIT:
            errors[field] = [f"{field} is 0 (no limit) up to {MAX_LIMIT}"]
    if errors:
        raise FieldErrors(errors)
    try:
        return services.create_key(
            name, owner=owner, models=list(models), expires=expires, rpm=rpm, tpm=tpm,
            user=user, via=via,
        )  # fmt: skip
    except services.KeyRefused as error:
        field, _, message = str(error).partition(": ")
        raise FieldErrors(
            {field if field == "models" else "name": [message or str(error)]}
        ) from None
    except ValidationError as error:
        found: dict[str, list[str]] = {}
        for field, messages in error.message_dict.items():
            found.setdefault("name" if field == "__all__" else field, []).extend(messages)
        raise FieldErrors(found) from None
    except IntegrityError:
        raise FieldErrors({"name": ["a live client key already has that name"]}) from None


def revoke(key: ClientKey, *, user: Any, via: str) -> bool:
    """Revoke ``key`` if it is live; return whether this call revoked it."""
    if key.revoked is not None:
        return False
    try:
        services.revoke_key(key.name, user=user, via=via)
    except services.KeyRefused:
        return False
    key.refresh_from_db()
    return True


def split_models(text: str) -> list[str]:
    """Models as typed in a form: separated by commas, spaces or lines."""
    return [m for m in text.replace(",", " ").split() if m]
