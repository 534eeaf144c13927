"""One replica as the supervisor runs it (agent.supervisor): what it knows, what it says."""

from __future__ import annotations

import collections
import datetime
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from agent import enginelog, weights


def utc_now() -> str:
    """Return the time now as the protocol writes it: ISO 8601 in UTC, to the second."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Replica:
    """What the supervisor knows of one replica it runs, and what the replica says of itself:
    its report, its record in the state folder, what its health answer means."""

    desired: dict[str, Any]
    state: str = "pending"
    reason: str = ""
    progress: float | None = None
    # What happens next: prepare (resolve weights), wait (back-off), run, stop, done.
    phase: str = "prepare"
    port: int | None = None
    pid: int | None = None
    proc: subprocess.Popen[bytes] | None = None
    start_ticks: int | None = None
    argv: list[str] = field(default_factory=list)
    health_path: str | None = "/health"
    started_wall: float = 0.0
    started_mono: float = 0.0
    restarts: int = 0
    crashes: collections.deque[float] = field(default_factory=collections.deque)
    next_start: float = 0.0
    # Set by a failed preparation to prepare again (rather than launch) after the wait.
    reprepare: bool = False
    prepared: tuple[str, dict[str, str], str] | None = None
    prep_thread: threading.Thread | None = None
    prep_error: weights.WeightsError | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    last_progress_report: float = 0.0
    stop_deadline: float = 0.0
    killed: bool = False
    # Recorded before the engine is started, so that an agent killed between starting
    # it and recording its pid still leaves a trace to find it by (its command line).
    launching: bool = False
    # Set while stopping: the failure to show once stopped (startup timeout) …
    fail_reason: str | None = None
    # … or the desired replica to start once stopped (a higher generation).
    next: dict[str, Any] | None = None
    # The engine key its running engine was started with ("": none, an engine started
    # before the control plane sent keys, which answers any caller until restarted).
    started_key: str = ""
    # The log file's size when its tail was last reported, and when (monotonic).
    log_size: int = -1
    log_reported: float = 0.0

    @property
    def id(self) -> int:
        return int(self.desired["id"])

    @property
    def generation(self) -> int:
        return int(self.desired.get("generation") or 0)

    @property
    def key(self) -> str:
        """The engine key the control plane wants this replica's engine to ask for."""
        return str(self.desired.get("engine_key") or "")

    def redact(self, text: str) -> str:
        """``text`` without this replica's engine keys (an engine's output may hold one:
        SGLang prints its arguments), for what is logged and reported."""
        return enginelog.redact(text, {self.key, self.started_key})

    def recent_crashes(self, window_s: float) -> int:
        """Return how many times it crashed in the last ``window_s``, forgetting older ones."""
        now = time.monotonic()
        while self.crashes and now - self.crashes[0] > window_s:
            self.crashes.popleft()
        return len(self.crashes)

    def report(self, log: list[str]) -> dict[str, Any]:
        """Return the replica's report (docs/agent-protocol.md), with its engine's log."""
        return {
            "replica": self.id,
            "generation": self.generation,
            "state": self.state,
            "reason": self.reason,
            "progress": self.progress,
            "port": self.port if self.state not in ("stopped", "pending") else None,
            "pid": self.pid,
            "restarts": self.restarts,
            "at": utc_now(),
            "log": log,
        }

    def record(self) -> dict[str, Any]:
        """Return what the state folder keeps of its engine, for a new agent to adopt it."""
        return {
            "replica": self.id,
            "generation": self.generation,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "port": self.port,
            "started_at": self.started_wall,
            "argv": self.argv,
            "health_path": self.health_path,
            "restarts": self.restarts,
            "desired": self.desired,
            "started_key": self.started_key,
        }

    def adopt(self, rec: dict[str, Any], pid: int, ticks: int | None) -> None:
        """Take the running engine a record describes (found alive by its pid) as its own."""
        self.pid = pid
        self.start_ticks = ticks
        self.argv = list(rec.get("argv") or [])
        self.port = rec.get("port")
        self.health_path = rec.get("health_path")
        # A record from before engine keys has none: that engine asks for none.
        self.started_key = str(rec.get("started_key") or "")
        self.started_wall = float(rec.get("started_at") or time.time())
        # Its startup timeout counts from now, not from when it started: an engine an
        # earlier agent ran for hours is checked (its health) before anything is judged,
        # and an agent's restart never fails an engine for its age.
        self.started_mono = time.monotonic()
        self.phase = "run"
        self.state = "starting"

    def health_verdict(self, answer: int | None) -> tuple[str, str]:
        """Return the state and reason a starting engine's health answer gives."""
        if self.health_path is None:
            return "ready", "running; rank 0 serves this multi-node replica"
        if answer == 200:
            why = "the engine answers /health"
            if self.key and not self.started_key:
                why += (
                    "; started before engine keys, its port answers any caller until the "
                    "replica is restarted"
                )
            return "ready", why
        if answer == 503:
            return "loading", "the engine is loading the model"
        return "loading", "the engine is loading the model (not listening yet)"
