"""Cluster test helpers: nodes joined through the real agent API code path."""

from __future__ import annotations

from typing import Any

from cluster import agentjoin
from cluster.models import JoinToken, Node


def inventory(cards: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """Return an inventory with the given card classes (power limit 700 W each)."""
    inv: dict[str, Any] = {
        "hostname": extra.pop("hostname", "host"),
        "cpu_cores": 32,
        "memory_mb": 256_000,
        "disk_free_mb": 1_000_000,
        "engines": {"vllm": "0.11.0", "llamacpp": "b1", "sim": "1"},
        "cards": [
            {"index": i, "class": c, "memory_mb": 81_000, "power_limit_w": 700}
            for i, c in enumerate(cards or [])
        ],
        "labels": {},
        "weights": [],
        "simulated": False,
    }
    inv.update(extra)
    return inv


def join_node(name: str, cards: list[str] | None = None, **extra: Any) -> tuple[Node, str]:
    """Join a node with a fresh join token; return it and its node token."""
    _, secret = JoinToken.issue(f"for {name}")
    return agentjoin.join(secret, name, inventory(cards, hostname=name, **extra))
