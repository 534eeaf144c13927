"""The catalog's named values: capacity classes, the guard role and formats, facility
levels, and the defaults ``normalize`` fills in and the checks hold to.
"""

from __future__ import annotations

from catalog.durations import HOUR, MINUTE

CLASS_CRITICAL = "critical"
CLASS_STANDARD = "standard"
CLASS_OPPORTUNISTIC = "opportunistic"
CLASSES = (CLASS_CRITICAL, CLASS_STANDARD, CLASS_OPPORTUNISTIC)

ROLE_GUARD = "guard"

# A model's residency (docs/federation.md): "local" never crosses to a federated peer.
RESIDENCY_LOCAL = "local"
RESIDENCIES = (RESIDENCY_LOCAL,)
# The guard app reads these formats; the names live here because the catalog must not
# import the guard app (imports point one way: catalog <- guard).
GUARD_FORMATS = ("qwen3guard", "llamaguard3", "shieldgemma", "json")

FACILITY_LEVELS = ("rack", "row", "room", "site")

DEFAULT_STARTUP_TIMEOUT = 20 * MINUTE
MAX_PREWARM = 12 * HOUR
