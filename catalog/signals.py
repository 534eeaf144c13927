"""What the catalog tells the layers above it, which connect to it in their ``AppConfig.ready()``.

The catalog imports no layer above it (docs/development.md, "The import direction"); where
one of them must act on a catalog change, it connects a receiver to a signal here:

- :data:`catalog_changed`, sent once a transaction that changed the catalog commits, with
  ``names``, the models it created, changed or deleted (sorted). ``catalog.services`` marks
  each change where it logs it (:func:`changed`), bulk creates included; a rolled-back
  change sends nothing, and a transaction that changed a thousand models sends it once.
  The cluster connects the reconciler's wake (``cluster.signals``).
- :data:`change_warnings`, sent as a model's change is saved, with ``before`` and
  ``after`` (``catalog.spec.Model``; ``before`` None for a new model); each receiver
  returns the warnings (sentences) the person who made the change is shown, the change
  being made all the same (:func:`warnings_for`). The guard connects one: switching off
  the only judge of its policy that answers (``guard.signals``).
- :data:`change_refusals`, sent as a change is checked, with ``before`` and ``after``
  (``after`` None for a deletion); each receiver returns the ``Problem``s that refuse the
  change (:func:`refusals_for`), reported with the rules' own and refusing it the same way
  on every surface. The guard connects one: a judge its policy names cannot be deleted,
  renamed or have its role changed away from guard (``guard.signals``).

The catalog has no receivers of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.dispatch import Signal

# Sent with names=[model names] after the commit of a change to those models.
catalog_changed = Signal()

# Sent with before=Model | None, after=Model as a change is saved; receivers return a
# list of warnings.
change_warnings = Signal()


# Sent with before=Model, after=Model | None as a change is checked; receivers return a
# list of catalog.problems.Problem that refuse it.
change_refusals = Signal()


def refusals_for(before: Any, after: Any) -> list[Any]:
    """Return the problems :data:`change_refusals`' receivers refuse a change with."""
    out: list[Any] = []
    for _, said in change_refusals.send(sender=_Send, before=before, after=after):
        out += list(said or ())
    return out


def warnings_for(before: Any, after: Any) -> list[str]:
    """Return what :data:`change_warnings`' receivers warn of about a change."""
    out: list[str] = []
    for _, said in change_warnings.send(sender=_Send, before=before, after=after):
        out += [str(w) for w in said or ()]
    return out


class _Send:
    """One transaction's send, run after it commits: the names it gathered."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def __call__(self) -> None:
        catalog_changed.send(sender=_Send, names=sorted(self.names))


def changed(names: Iterable[str]) -> None:
    """Mark models changed: :data:`catalog_changed` is sent with them once the current
    transaction commits (at once outside one), once per transaction."""
    conn = transaction.get_connection()
    if not conn.in_atomic_block:
        send = _Send()
        send.names.update(names)
        send()
        return
    send = next((e[1] for e in conn.run_on_commit if isinstance(e[1], _Send)), None)
    if send is None:
        send = _Send()
        # robust: a receiver that fails is logged and does not undo a committed change.
        transaction.on_commit(send, robust=True)
    send.names.update(names)
