"""The credential a batch's lines are sent with:
``llmgw-bt-<key digest>.<batch>.<until>[.s].<mac>`` (``.s``: a batch made with
``scale_up``, its lines counted as load for scaling).

The runner holds no client secret: it sends each line as the key that made the batch,
named by that key's digest and signed with the deployment's ``SECRET_KEY``. The gateway
checks the signature and that ``until`` (the batch's window's end, a Unix time) has not
passed (no query), takes the key from its table as a live request's key
(revoked or expired: 401, out of scope: 404, its budgets and the guard as ever), and puts
it in the lowest admission band, whatever band the key has; its traffic is counted as a
batch's (``Key.batch``: the Traffic page, the charts, the usage rows). Load scaling leaves
a batch's lines out (``Key.batch`` "idle": they run on the replicas there are, in the gaps
of live traffic) unless the batch was made with ``scale_up`` ("scale": counted as load,
so scaling may add replicas for them up to the model's max in force).
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import time
from typing import Any

from django.conf import settings

from gateway.path.admission import BATCH

PREFIX = "llmgw-bt-"
BAND = BATCH
SCALE = ".s"  # after ``until``: the batch's lines count as load (``scale_up``)


def _mac(key_digest: str, batch_id: str, until: int, scale: bool = False) -> str:
    message = f"batch-line:{key_digest}.{batch_id}.{until}{SCALE if scale else ''}".encode()
    return hmac.new(settings.SECRET_KEY.encode(), message, hashlib.sha256).hexdigest()


def make(key_digest: str, batch_id: str, until: int, scale: bool = False) -> str:
    """The credential; ``scale``: its lines count as load (load scaling may add replicas
    for them, up to the model's max in force)."""
    mark = SCALE if scale else ""
    return (
        f"{PREFIX}{key_digest}.{batch_id}.{until}{mark}.{_mac(key_digest, batch_id, until, scale)}"
    )


def key_of(secret: str, keys: dict[str, Any], now: float | None = None) -> Any:
    """The key a batch credential stands for, in the lowest band, its ``batch`` "idle" or
    "scale"; None when it is not a valid one, its batch's window is over, or the key is
    gone."""
    parts = secret[len(PREFIX) :].split(".")
    scale = len(parts) == 5 and parts[3] == SCALE[1:]
    if scale:
        del parts[3]
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    key_digest, batch_id, until, mac = parts
    if not hmac.compare_digest(mac, _mac(key_digest, batch_id, int(until), scale)):
        return None
    if int(until) < (time.time() if now is None else now):
        return None
    key = keys.get(key_digest)
    if key is None:
        return None
    return dataclasses.replace(key, priority=BAND, batch="scale" if scale else "idle")
