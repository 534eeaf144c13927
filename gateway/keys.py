"""Client keys as the console and the API take them, over ``gateway.services`` (which
makes them: ``create_key``): revoking one they show, and the models as a form types them."""

from __future__ import annotations

from typing import Any

from gateway import services
from gateway.models import ClientKey


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
