"""``GET /v1/models`` and ``GET /v1/models/{id}``: what a key may name, from the table in
memory (models, aliases, adapters, external models the key lists)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from catalog.rules.names import bad_character
from gateway.path import errors
from gateway.path.cycle import Cycle
from gateway.path.table import Entry, Key, Table

PATH = "/v1/models"


async def answer(
    cycle: Cycle, method: str, path: str, table: Table, key: Key, now: datetime
) -> None:
    """Answer a request to ``/v1/models`` or below it (GET only). A model switched off
    (``gateway.path.table.switched_off`` at ``now``) with no replica left is not listed."""
    if method != "GET":
        raise errors.method_not_allowed(path, "GET")
    if path == PATH:
        await cycle.json(200, {"object": "list",
                               "data": [describe(e, table) for e in table.listed(key, now)]})  # fmt: skip
        return
    name = path[len(PATH) + 1 :]
    entry = table.resolve(name)
    if entry is None or not key.may_name(entry):
        raise errors.model_not_found(name)
    await cycle.json(200, describe(entry, table))


def owned_by(owner: str) -> str:
    """Return a model's owner as ``owned_by`` says it: "llmgw" for none, and for one the
    catalog's rules refuse now (a control character, markup: a row written before the rule
    said so), never handed to clients."""
    if not owner or bad_character(owner) or any(c in owner for c in "<>\"&'`"):
        return "llmgw"
    return owner


def describe(entry: Entry, table: Table) -> dict[str, Any]:
    """A model, alias or adapter as ``GET /v1/models`` lists it."""
    m = entry.model
    pool = table.pool(m.name)
    context = pool.context if pool and pool.context else m.context_length
    out: dict[str, Any] = {
        "id": entry.name,
        "object": "model",
        "created": table.added.get(m.name, table.created),
        "owned_by": owned_by(m.owner),
        "description": m.description,
        "context_length": context or None,
        "max_output": m.max_output or None,
        "capabilities": {
            "tools": m.capabilities.tools,
            "vision": m.capabilities.vision,
            "embeddings": m.capabilities.embeddings,
        },
    }
    if entry.adapter:
        out["parent"] = m.name
        out["adapter"] = True
    elif entry.name != m.name:
        out["alias_of"] = m.name
    if m.external is not None:
        out["external"] = True
    return out
