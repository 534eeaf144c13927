"""Where this cluster's keys live in one Redis: ``llmgw:<cluster>:``, ``<cluster>`` a tag
of the cluster's database (host, port, name).

Two clusters (two regions federated, or two test runs) may share one Redis server. Every
key the gateway and the cluster keep there of their own (budgets, owners' reservations,
load reports, the gateway processes' shared admission, ejections and breakers) starts
with this prefix, so one cluster never reads or spends another's. Every process of one
cluster reads the same database, so they agree on the prefix without being told.
"""

from __future__ import annotations

import functools
import hashlib

from django.conf import settings


@functools.lru_cache(maxsize=8)
def _tag(where: str) -> str:
    return hashlib.sha256(where.encode()).hexdigest()[:10]


def prefix() -> str:
    """Return ``llmgw:<cluster>:``, this cluster's part of Redis (see the module)."""
    db = settings.DATABASES["default"]
    where = f"{db.get('HOST') or ''}:{db.get('PORT') or ''}/{db.get('NAME') or ''}"
    return f"llmgw:{_tag(where)}:"
