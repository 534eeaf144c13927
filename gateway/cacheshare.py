"""Cached prompt tokens: what a token budget spares of them, and the cache-hit share.

A token budget charges a prompt token the engine read from its prefix cache at the
model's ``cached_token_weight`` (0 to 1) of a fresh one's (``spared``). The cache-hit
share: of the prompt tokens a key, an owner or a model sent, those the engine read from
its prefix cache (``gateway.models.Usage``'s ``tokens_cached`` over its ``tokens_in``),
today, per model; shown on the Keys page and on an owner's page."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db.models import Sum

from gateway.models import Usage

WHICH = ("key", "owner", "model")


def spared(cached: int, weight: float) -> int:
    """Tokens a budget does not charge of ``cached`` cached prompt tokens at ``weight``
    (whole tokens, rounded down: a budget never spares more than the weight says)."""
    if cached <= 0 or not 0 <= weight < 1:
        return 0
    return int(cached * (1 - weight))


def share(tokens_in: int | None, cached: int | None) -> int | None:
    """The cached share of ``tokens_in`` in whole per cent (None: no prompt tokens)."""
    if not tokens_in:
        return None
    return round(100 * min(cached or 0, tokens_in) / tokens_in)


@dataclass(frozen=True)
class Row:
    model: str
    requests: int
    tokens_in: int
    tokens_cached: int

    @property
    def share(self) -> int | None:
        return share(self.tokens_in, self.tokens_cached)


def per_model(since: dt.datetime, **which: str) -> list[Row]:
    """Per model, the usage since ``since`` of the one key, owner or model named (one
    query, grouped in the database), the most prompt tokens first."""
    ((field, name),) = which.items()
    if field not in WHICH:
        raise ValueError(f"name one of {', '.join(WHICH)}")
    rows = (
        Usage.objects.filter(minute__gte=since, **{field: name})
        .order_by()
        .values("model")
        .annotate(r=Sum("requests"), i=Sum("tokens_in"), c=Sum("tokens_cached"))
    )
    out = [Row(r["model"] or "—", r["r"] or 0, r["i"] or 0, r["c"] or 0) for r in rows]
    return sorted(out, key=lambda r: (-r.tokens_in, r.model))
