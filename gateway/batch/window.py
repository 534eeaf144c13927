"""A batch held to its models' schedule windows (``"schedule_window": true`` at create):
its lines are sent only while the model each names is inside one of its schedule windows
(``scaling.schedule``, read as the reconciler reads them: ``catalog.rules.window_at`` in
the control time zone), so a nightly batch runs at night. Pure: the runner reads the
models from the catalog and asks here.
"""

from __future__ import annotations

from datetime import datetime

from catalog import rules, spec


def closed(model: spec.Model | None, now: datetime) -> str:
    """Why a held batch's line for ``model`` may not be sent at ``now`` ('' when it may):
    the model is gone, has no schedule window at all, or none is in force. ``now`` is
    aware, in the control time zone."""
    if model is None:
        return "its model is not in the catalog"
    if not model.scaling.schedule:
        return f"model {model.name} has no schedule window to hold the batch to"
    if rules.window_at(model.scaling, now) is None:
        spans = ", ".join(f"{','.join(w.days) or 'every day'} {w.from_}-{w.to}"
                          for w in model.scaling.schedule)  # fmt: skip
        return f"waiting for a schedule window of model {model.name} ({spans})"
    return ""
