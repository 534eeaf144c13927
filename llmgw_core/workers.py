"""Several processes of one server on one port: a parent that forks ``count`` workers,
restarts one that dies and stops them all on SIGTERM or SIGINT.

Each worker listens on a socket of its own bound to the same address with
``SO_REUSEPORT`` (the caller's ``serve`` makes it), and the kernel spreads new
connections over the listening sockets by a hash of each connection's addresses. The
other way, one socket made by the parent and inherited by every worker, shares one
accept queue, and on Linux a worker whose loop is free first takes whatever arrives: on a
busy machine one worker ends up with most connections while another idles. With a
socket each, a worker that dies takes its socket with it, and no new connection is sent
there while it is away (the connections it held, and any it had not yet accepted, are
reset: the client's retry reaches another worker).

The parent is single-threaded and forks before any thread or event loop starts (a
worker imports and starts what it serves after the fork). It waits for its signals with
``sigtimedwait`` (blocked, so none is lost between two waits): a worker's readiness
(``READY``, a real-time signal, queued, so two at once are both heard), a worker's end
(``SIGCHLD``), a stop (``SIGTERM``, ``SIGINT``). A worker that ends while the parent is
not stopping is started again after ``restart_delay``; each says so in the log. On a
stop each worker is sent SIGTERM and drains (its server's own bound: the streams in
flight end, new connections go nowhere since its socket is closed); one still alive
``grace`` seconds later is killed. A worker whose parent dies (``kill -9``) is sent
SIGTERM by the kernel (``PR_SET_PDEATHSIG``): no orphan keeps the port.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

READY = signal.SIGRTMIN
STOPS = (signal.SIGTERM, signal.SIGINT)
WAITED = {signal.SIGCHLD, READY, *STOPS}
# A worker that served at least this long before it died is started again at once; one
# that dies sooner waits FIRST, then twice as long each time in a row, at most CAP.
STEADY = 10.0
FIRST = 0.5
CAP = 30.0
# The longest the parent's loop sleeps between two looks at its workers.
TICK = 1.0
_PR_SET_PDEATHSIG = 1


def cores() -> int:
    """The cores this process may run on (its affinity, else the machine's)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def restart_delay(lived: float, quick: int) -> tuple[float, int]:
    """The seconds before a worker that served ``lived`` seconds is started again, and
    the count of quick deaths in a row after this one (``quick`` before it)."""
    if lived >= STEADY:
        return 0.0, 0
    return min(CAP, FIRST * 2**quick), quick + 1


def ended(status: int) -> str:
    """How a process ended, from ``waitpid``'s status."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = str(number)
        return f"killed by signal {number} ({name})"
    return f"exited with status {os.WEXITSTATUS(status)}"


@dataclass
class Slot:
    """One worker's place: its number, its process, and its history of deaths."""

    number: int
    pid: int = 0
    started: float = 0.0
    ready: bool = False
    quick: int = 0
    due: float | None = None  # when it is started again, while it waits
    pids: list[int] = field(default_factory=list)


class Supervisor:
    """Fork ``count`` workers running ``serve(ready)`` (which calls ``ready()`` once it
    accepts connections and returns when it stopped) and keep them running."""

    def __init__(
        self,
        count: int,
        serve: Callable[[Callable[[], None]], None],
        *,
        name: str,
        grace: float,
        say: Callable[[str], None],
        warn: Callable[[str], None],
        serving: Callable[[list[int]], None],
    ) -> None:
        self.slots = [Slot(n + 1) for n in range(count)]
        self.serve = serve
        self.name = name
        self.grace = grace
        self.say = say
        self.warn = warn
        self.serving = serving  # told once, when every first worker accepts connections
        self.parent = os.getpid()
        self.stopping = False
        self._told = False
        self._mask: set[signal.Signals] = set()

    def run(self) -> int:
        """Serve until a stop; the exit status for the parent."""
        self._mask = signal.pthread_sigmask(signal.SIG_BLOCK, WAITED)
        try:
            for slot in self.slots:
                self._start(slot)
            while not self.stopping:
                self._wait(self._timeout())
                self._restart_due()
            return self._stop()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)

    # The parent's loop.
    def _timeout(self) -> float:
        due = [s.due for s in self.slots if s.due is not None]
        if not due:
            return TICK
        return max(0.0, min(TICK, min(due) - time.monotonic()))

    def _wait(self, timeout: float) -> None:
        info = signal.sigtimedwait(WAITED, timeout)
        while info is not None:
            if info.si_signo in STOPS:
                if not self.stopping:
                    self.say(f"{self.name}: {signal.Signals(info.si_signo).name}: stopping "
                             f"the workers (each drains, at most {self.grace:g} s)")  # fmt: skip
                self.stopping = True
            elif info.si_signo == READY:
                self._ready(info.si_pid)
            info = signal.sigtimedwait(WAITED, 0)
        self._reap()

    def _ready(self, pid: int) -> None:
        for slot in self.slots:
            if slot.pid == pid and not slot.ready:
                slot.ready = True
                self.say(f"{self.name} worker {slot.number} serving (pid {pid})")
        if not self._told and all(s.ready for s in self.slots):
            self._told = True
            self.serving([s.pid for s in self.slots])

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for slot in self.slots:
                if slot.pid == pid:
                    self._died(slot, status)

    def _died(self, slot: Slot, status: int) -> None:
        lived = time.monotonic() - slot.started
        slot.pid, slot.ready = 0, False
        if self.stopping:
            self.say(f"{self.name} worker {slot.number} (pid {slot.pids[-1]}) stopped: "
                     f"{ended(status)}")  # fmt: skip
            return
        delay, slot.quick = restart_delay(lived, slot.quick)
        slot.due = time.monotonic() + delay
        self.warn(f"{self.name} worker {slot.number} (pid {slot.pids[-1]}) died after "
                  f"{lived:.1f} s: {ended(status)}; starting it again in {delay:g} s"
                  + (f" ({slot.quick} quick deaths in a row)" if slot.quick > 1 else ""))  # fmt: skip

    def _restart_due(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if not self.stopping and slot.due is not None and slot.due <= now:
                slot.due = None
                self._start(slot)

    def _stop(self) -> int:
        alive = [s for s in self.slots if s.pid]
        for slot in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(slot.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        while any(s.pid for s in self.slots) and time.monotonic() < deadline:
            self._wait(min(TICK, max(0.0, deadline - time.monotonic())))
        for slot in self.slots:
            if slot.pid:
                self.warn(f"{self.name} worker {slot.number} (pid {slot.pid}) still running "
                          f"{self.grace:g} s after the stop: killed")  # fmt: skip
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(slot.pid, 0)
                slot.pid = 0
        self.say(f"{self.name}: every worker stopped")
        return 0

    # A worker.
    def _start(self, slot: Slot) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            slot.pid, slot.started, slot.ready = pid, time.monotonic(), False
            slot.pids.append(pid)
            return
        self._worker()

    def _worker(self) -> None:
        """In the child: serve, then leave (never back into the parent's loop)."""
        code = 1
        try:
            _die_with_parent()
            if os.getppid() != self.parent:  # the parent died before the line above
                os._exit(0)
            signal.pthread_sigmask(signal.SIG_SETMASK, self._mask)
            parent = self.parent
            self.serve(lambda: os.kill(parent, READY))
            code = 0
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        except BaseException:
            traceback.print_exc()
        finally:
            # What the worker registered to run at its exit (the last counts written).
            with contextlib.suppress(BaseException):
                atexit._run_exitfuncs()
            with contextlib.suppress(BaseException):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _die_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent dies (Linux)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
