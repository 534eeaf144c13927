"""The gateway's Prometheus series in multiprocess mode: the folder this host's gateway
processes share, and the mode set once (``multiprocess``) before any series is made.

The path makes its few own series after it (the budgets' and the shared state's
fallbacks, ``gateway.path.limits`` and ``gateway.shared``; the judges' breakers,
``gateway.path.guarding``); ``gateway.records.metrics`` makes the rest and serves
``/metrics`` summed over the folder.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

from django.conf import settings

from llmgw_core.processes import alive

NS = "llmgw_gateway"

log = logging.getLogger(__name__)

_lock = threading.Lock()
_folder: Path | None = None
# This process's id, known without a system call: prometheus_client asks for it on every
# sample written (a fork changes it, and a child must write files of its own), which was
# a few per cent of a request's time. Set again in a forked child, before it runs on.
_pid = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def pid() -> int:
    """This process's id (``os.getpid()``, kept)."""
    return _pid[0]


def folder() -> Path:
    """The folder the processes of this host share (made, private, on first use)."""
    given = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    path = Path(given) if given else Path(settings.DATA_DIR) / "metrics"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def multiprocess() -> Path:
    """Put this process's series in multiprocess mode over ``folder()`` (once): before
    any series of the process is made, so each is written to the shared folder."""
    global _folder
    with _lock:
        if _folder is not None:
            return _folder
        path = folder()
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
        # Imported here: prometheus_client picks its value class as it is imported; this
        # process's multiprocess folder is set first (just above).
        from prometheus_client import multiprocess as shared  # noqa: PLC0415
        from prometheus_client import values  # noqa: PLC0415

        # The mode is chosen when prometheus_client is imported; say it again in case it
        # was imported before the folder was known.
        values.ValueClass = values.MultiProcessValue(pid)
        _forget_dead(path, shared)
        _folder = path
        return path


def _forget_dead(path: Path, shared: Any) -> None:
    """Drop the live gauges of processes no longer running (their counters stay)."""
    for file in path.glob("gauge_live*_*.db"):
        try:
            pid = int(file.stem.rsplit("_", 1)[1])
        except ValueError:
            continue
        if not alive(pid):
            shared.mark_process_dead(pid, str(path))


_fallbacks: dict[str, Any] = {}


def fallback_counter(name: str, doc: str, what: str) -> Any:
    """``llmgw_gateway_<name>_total{kind}``: what this process did alone while Redis was
    away (made once per name; None where no series can be written, said once, naming
    ``what`` is not counted)."""
    with _lock:
        if name in _fallbacks:
            return _fallbacks[name]
    try:
        multiprocess()  # the multiprocess folder first, as every series of the gateway
        # Imported here: prometheus_client picks its value class as it is imported; this
        # process's multiprocess folder is set first (series.multiprocess).
        from prometheus_client import Counter  # noqa: PLC0415

        counter: Any = Counter(name, doc, ("kind",), namespace=NS, registry=None)
    except Exception:  # no metrics here (a data folder that cannot be written)
        log.warning("%s is not counted in /metrics", what, exc_info=True)
        counter = None
    with _lock:
        return _fallbacks.setdefault(name, counter)
