"""Each replica's engine key: what its engine's port asks of every caller.

The agent starts every engine with its replica's key (docs/agent-protocol.md, "Engine
keys"), so an engine answers only who holds it: the gateway, the guard's client, the
agent's own health checks. Nothing is stored: the key is an HMAC of the control plane's
secret key (``settings.SECRET_KEY``, the same in every web and gateway process) and the
replica's id, so every process computes it when it needs it, and an agent learns its
replicas' keys in its desired list, over its node token's channel.

Never shown: not in a page, an API answer (but the desired list, to its node) or a log.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac

from django.conf import settings

# Says what a leaked string is (a log scrubber, a secret scanner), and never a client key's
# or a node token's prefix.
PREFIX = "llmgw_engine_"


@functools.lru_cache(maxsize=8192)
def _derive(secret: str, replica_id: int) -> str:
    mac = hmac.new(secret.encode(), f"llmgw engine key\0{replica_id}".encode(), hashlib.sha256)
    return PREFIX + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def engine_key(replica_id: int, secret: str | None = None) -> str:
    """Return replica ``replica_id``'s engine key (``secret``: the settings' by default)."""
    if secret is None:
        secret = str(settings.SECRET_KEY)
    return _derive(secret, int(replica_id))


def authorization(replica_id: int) -> str:
    """Return the ``Authorization`` header's value that replica's engine takes."""
    return f"Bearer {engine_key(replica_id)}"
