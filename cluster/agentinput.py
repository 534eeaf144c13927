"""What an agent sends, checked before anything is written: its inventory (the node's
fields and cards) and what each card uses; ``AgentError`` refuses the request, naming the
field. Used by the join, the heartbeat and the reports (``cluster.agentjoin``,
``cluster.agentbeat``, ``cluster.agentreport``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from cluster.models import (
    Card,
    Node,
)


class AgentError(Exception):
    """A request from an agent that cannot be applied; ``status`` is the HTTP answer."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


# The largest values the database's columns hold.
INT32 = 2**31 - 1
INT64 = 2**63 - 1


def whole_number(value: Any, where: str, hi: int = INT64, default: int | None = 0) -> Any:
    """A whole number an agent reports, from 0 to ``hi``; missing or null is ``default``.

    A float is taken whole (some tools report memory as one); anything else, or a number
    outside what the column holds, raises AgentError naming ``where``.
    """
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= hi  # NaN fails this too
    ):
        raise AgentError(f"{where} must be a whole number from 0 to {hi}, not {value!r:.40}")
    return int(value)


def _watts(value: Any, where: str) -> float:
    """A card's power limit in watts, from 0 to a megawatt; missing or null is 0."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1e6:
        raise AgentError(f"{where} must be a number of watts from 0 to 1000000, not {value!r:.40}")
    return float(value)


# What an inventory carries that changes while nothing about the node does: left out of
# its digest, and written by every heartbeat.
VOLATILE = ("disk_free_mb", "cards_use")


def inventory_digest(inv: Any) -> str:
    """Return the digest of an inventory as sent, its volatile values left out.

    Used by heartbeat: a node whose stored digest is this one already has the fields and
    cards this inventory gives, so they are neither read nor compared again. The digest
    is the control plane's own (canonical JSON), so any agent, old or new, benefits.
    """
    if not isinstance(inv, dict):
        return ""
    stable = {k: v for k, v in inv.items() if k not in VOLATILE}
    text = json.dumps(stable, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def read_inventory(inv: Any) -> dict[str, Any]:
    """Return the node fields of an agent's inventory, or raise AgentError naming the fault.

    The inventory comes from a machine, not a person, but a bad one must still change
    nothing and say what is wrong.
    """
    if not isinstance(inv, dict):
        raise AgentError("inventory must be a JSON object (docs/agent-protocol.md)")
    cards = inv.get("cards", [])
    if not isinstance(cards, list):
        raise AgentError("inventory.cards must be a list")
    seen: set[int] = set()
    clean_cards = []
    for i, c in enumerate(cards):
        if (
            not isinstance(c, dict)
            or not isinstance(c.get("index"), int)
            or not isinstance(c.get("class"), str)
        ):
            raise AgentError(f"inventory.cards[{i}] needs an integer index and a class")
        index = whole_number(c["index"], f"inventory.cards[{i}].index", INT32)
        if index in seen:
            raise AgentError(f"inventory.cards[{i}]: index {index} is listed twice")
        seen.add(index)
        clean_cards.append(
            {
                "index": index,
                "gpu_class": c["class"].strip().lower()[:100],
                "memory_mb": whole_number(c.get("memory_mb"), f"inventory.cards[{i}].memory_mb"),
                "power_limit_w": _watts(
                    c.get("power_limit_w"), f"inventory.cards[{i}].power_limit_w"
                ),
                "uuid": str(c.get("uuid") or "")[:200],
                "mig_of": whole_number(
                    c.get("mig_of"), f"inventory.cards[{i}].mig_of", INT32, None
                ),
            }
        )
    for key in ("labels", "engines"):
        value = inv.get(key, {})
        if not isinstance(value, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise AgentError(f"inventory.{key} must map text to text")
    weights = inv.get("weights", [])
    if not isinstance(weights, list) or not all(isinstance(w, str) for w in weights):
        raise AgentError("inventory.weights must be a list of sources")
    use = read_card_use(inv)
    return {
        **({"card_use": use} if use is not None else {}),
        "hostname": str(inv.get("hostname") or "")[:200],
        "agent_version": str(inv.get("agent_version") or "")[:50],
        "cpu_cores": whole_number(inv.get("cpu_cores"), "inventory.cpu_cores", INT32),
        "memory_mb": whole_number(inv.get("memory_mb"), "inventory.memory_mb"),
        "disk_free_mb": whole_number(inv.get("disk_free_mb"), "inventory.disk_free_mb"),
        "labels": inv.get("labels", {}),
        "engines": inv.get("engines", {}),
        "weights": weights,
        "simulated": bool(inv.get("simulated", False)),
        "cards": clean_cards,
        "inventory_digest": inventory_digest(inv),
    }


def read_card_use(inv: Any) -> dict[str, dict[str, int | None]] | None:
    """Return what each card uses as an inventory's ``cards_use`` says (docs/agent-protocol.md),
    by card index as text; None when it says nothing (an older agent: what was held stays).

    Each entry names a card of the inventory's ``cards`` once; ``memory_used_mb`` is a whole
    number up to that card's ``memory_mb`` and ``utilization`` a percent from 0 to 100,
    each or null (the card cannot say). Anything else raises AgentError naming the field:
    the heartbeat is refused and nothing of it is written.
    """
    if not isinstance(inv, dict) or "cards_use" not in inv:
        return None
    use = inv["cards_use"]
    if not isinstance(use, list):
        raise AgentError("inventory.cards_use must be a list (docs/agent-protocol.md)")
    sizes = {
        c["index"]: c.get("memory_mb")
        for c in inv.get("cards") or ()
        if isinstance(c, dict) and isinstance(c.get("index"), int)
    }
    out: dict[str, dict[str, int | None]] = {}
    for i, u in enumerate(use):
        where = f"inventory.cards_use[{i}]"
        if not isinstance(u, dict) or isinstance(u.get("index"), bool):
            raise AgentError(f"{where} must be an object with a card's index")
        index = u.get("index")
        if not isinstance(index, int) or index not in sizes:  # a list is no key: not a 500
            raise AgentError(
                f"{where}.index must be the index of one of inventory.cards "
                f"({', '.join(map(str, sorted(sizes))) or 'none'}), not {index!r:.40}"
            )
        if str(index) in out:
            raise AgentError(f"{where}: card {index} is listed twice")
        size = sizes[index]
        top = size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else INT64
        memory = whole_number(u.get("memory_used_mb"), f"{where}.memory_used_mb", top, None)
        busy = u.get("utilization")
        if busy is not None and (
            isinstance(busy, bool) or not isinstance(busy, int | float) or not 0 <= busy <= 100
        ):
            raise AgentError(
                f"{where}.utilization must be a percent from 0 to 100, not {busy!r:.40}"
            )
        out[str(index)] = {
            "memory_used_mb": memory,
            "utilization": None if busy is None else round(busy),
        }
    return out


def apply_inventory(node: Node, fields: dict[str, Any]) -> None:
    cards = fields.pop("cards")
    for key, value in fields.items():
        setattr(node, key, value)
    node.save()
    sync_cards(node, cards)


def sync_cards(node: Node, cards: list[dict[str, Any]]) -> None:
    existing = {c.index: c for c in Card.objects.filter(node=node)}
    for c in cards:
        current = existing.get(c["index"])
        if current is None:
            Card.objects.create(node=node, **c)
        elif any(getattr(current, k) != v for k, v in c.items()):
            Card.objects.filter(pk=current.pk).update(**c)
    gone = set(existing) - {c["index"] for c in cards}
    if gone:
        Card.objects.filter(node=node, index__in=gone).delete()
