"""The project's threads a test leaves running after it ends.

A thread that outlives its test runs beside the next one: it touches the database after
its test's teardown, logs while pytest writes a failure, and under xdist it once crashed a
worker (CPython 3.11's ``ast.parse`` raced pytest's own, an INTERNALERROR that ends the
whole run). ``tests/conftest.py`` fails the test that leaves one, naming the thread, where
it was started and where it is now.

A thread is the project's when it runs the project's code: its target is a function of
the project's (``tests/`` included), or a frame of the project's is on its stack now (a
pool's worker busy with the project's work; an idle worker waits in the library alone and
is left be, as are the library's own threads).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from pathlib import Path
from types import FrameType

ROOT = str(Path(__file__).resolve().parents[1]) + "/"
HERE = str(Path(__file__).resolve())
# Where the check applies: the folders whose tests it has been run over and whose leaks are
# fixed (the rest of the suite is to follow, folder by folder).
CHECKED = ("tests/updates/", "tests/cluster/", "tests/gateway/")
# Threads a gateway process runs for its whole life, with no way yet to stop one: the
# in-process gateways of tests/gateway/ start them (test_metrics, test_ejection,
# test_federation_reach). Left be until they can be stopped.
FOR_LIFE = ("gateway-metrics", "gateway-traffic")
# How long a thread told to stop in its test's teardown has to end before it counts as
# left running: it may be mid-way through its last step.
GRACE = 5.0

_started_at: weakref.WeakKeyDictionary[threading.Thread, str] = weakref.WeakKeyDictionary()
_start = threading.Thread.start


def _project(filename: str) -> bool:
    return filename.startswith(ROOT) and "/.venv/" not in filename and filename != HERE


def _project_frames(frame: FrameType | None, limit: int = 3) -> list[str]:
    """The innermost ``limit`` frames of the project's on a stack, innermost first."""
    out = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        if _project(code.co_filename):
            out.append(f"{code.co_filename[len(ROOT) :]}:{frame.f_lineno} ({code.co_name})")
        frame = frame.f_back
    return out


def _recording_start(self: threading.Thread) -> None:
    _started_at[self] = " < ".join(_project_frames(sys._getframe(1))) or "outside the project"
    _start(self)


def watch() -> None:
    """Record where each thread is started from now on (``threading.Thread.start``)."""
    threading.Thread.start = _recording_start  # type: ignore[method-assign]


def _target_is_project(thread: threading.Thread) -> bool:
    target = getattr(thread, "_target", None)
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is not None:
        return _project(code.co_filename)
    run = type(thread).run
    return run is not threading.Thread.run and _project(run.__code__.co_filename)


def runs_project_code(thread: threading.Thread) -> bool:
    if _target_is_project(thread):
        return True
    frame = sys._current_frames().get(thread.ident or -1)
    return bool(_project_frames(frame, 1))


def describe(thread: threading.Thread) -> str:
    frame = sys._current_frames().get(thread.ident or -1)
    now = " < ".join(_project_frames(frame)) or "in a library"
    target = getattr(thread, "_target", None)
    name = getattr(target, "__qualname__", type(thread).__qualname__)
    return (
        f"thread {thread.name!r} (target {name}), started at "
        f"{_started_at.get(thread, 'an unknown place')}, now at {now}"
    )


def checked(path: str) -> bool:
    """Whether the check applies to the test file at ``path``."""
    return path.startswith(tuple(ROOT + c for c in CHECKED))


def left_running(before: set[threading.Thread]) -> list[threading.Thread]:
    """The project's threads not in ``before`` still running after ``GRACE`` s."""
    new = [
        t
        for t in threading.enumerate()
        if t not in before
        and not isinstance(t, threading._DummyThread)  # not joinable: started outside Python
        and t.name not in FOR_LIFE
        and runs_project_code(t)
    ]
    deadline = time.monotonic() + GRACE
    for t in new:
        t.join(max(0.0, deadline - time.monotonic()))
    return [t for t in new if t.is_alive() and runs_project_code(t)]
