"""Whether a process of this machine is still running, by its pid: what the gateway's
metrics (a dead process's live gauges) and the guard's breaker rows (a dead process's
rows) each ask of the pids they find."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Return whether process ``pid`` runs on this machine (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
