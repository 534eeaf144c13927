"""The cluster's GPU classes, as the catalog's console reads them without importing the cluster.

Imports point one way (catalog <- cluster, ``../shared/spec/architecture.md``): the cluster
app registers its inventory here when it starts (``cluster.apps``), and the model form
asks through ``source()``. With nothing registered (the catalog on its own), the form
lists no classes and says nothing about fit; the rules never depend on any of it, since
the catalog does not know the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Inventory(Protocol):
    """What the cluster offers: its classes now, and whether a profile's cards fit them."""

    def gpu_classes(self) -> list[Any]:
        """Return the cluster's classes (``cluster.inventory.ClassInfo``), by name."""

    def shortfall(
        self, classes: Mapping[str, Any], gpu_class: str, gpus_per_node: int, nodes: int
    ) -> str | None:
        """Return why such a profile's replicas cannot be placed now, or None."""


_registered: Inventory | None = None


def register(inventory: Inventory | None) -> None:
    """Make ``inventory`` the one the console reads (None: forget it)."""
    global _registered
    _registered = inventory


def source() -> Inventory | None:
    """Return the registered inventory, or None."""
    return _registered
