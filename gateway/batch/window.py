"""A batch held to its models' schedule windows (``"schedule_window": true`` at create):
its lines are sent only while the model each names is inside one of its schedule windows
(``scaling.schedule``, read as the reconciler reads them: ``catalog.rules.window_at`` in
the control time zone), so a nightly batch runs at night. Pure: the runner reads the
models from the catalog and asks here.

Each line ends with a defined outcome; it waits only where a window will come:

- its name a model, an alias of one or an adapter of one: that model's windows;
- a window in force: the line goes (``GO``); the model has windows, none in force now:
  it waits for one (``WAIT``), until the batch's own window ends (``expired``, what
  finished kept);
- the model has no schedule window at all (a model switched off, min 0 and max 0, has
  none to wait for either): nothing will open, so the line is an error line saying why
  (``FAIL``), not a wait to the batch's end;
- a name the catalog does not hold: the line goes, and the gateway answers it as any
  request (a name it does not know: 404 ``model_not_found`` in the error file).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

from catalog import rules, spec

GO, WAIT, FAIL = "go", "wait", "fail"


def named(models: Mapping[str, spec.Model], name: str) -> spec.Model | None:
    """The catalog model ``name`` means: by its name, an alias or one of its adapters."""
    found = models.get(name)
    if found is not None:
        return found
    for m in models.values():
        if name in m.aliases or any(a.name == name for a in m.adapters):
            return m
    return None


def verdict(models: Mapping[str, spec.Model], name: str, now: datetime) -> tuple[str, str]:
    """Whether a held batch's line naming ``name`` goes at ``now`` (``GO``), waits for a
    window (``WAIT``, why) or ends as an error line (``FAIL``, why). ``now`` is aware, in
    the control time zone."""
    model = named(models, name)
    if model is None:
        return GO, ""  # the gateway answers it (404 for a name it does not know either)
    if not model.scaling.schedule:
        return FAIL, (
            f"model {model.name} has no schedule window to hold the batch to "
            '("schedule_window": true); give it one, or make the batch without it'
        )
    if rules.window_at(model.scaling, now) is None:
        spans = ", ".join(f"{','.join(w.days) or 'every day'} {w.from_}-{w.to}"
                          for w in model.scaling.schedule)  # fmt: skip
        return WAIT, f"waiting for a schedule window of model {model.name} ({spans})"
    return GO, ""
