"""Run the engines of a node's desired replicas: start, watch, restart, stop. No Django here.

``Supervisor.converge`` takes the node's whole desired list; ``Supervisor.tick`` moves
every replica one step towards it and is called every fraction of a second (by the
supervisor's own thread once ``start`` is called, or directly by tests). Each state change
is handed to the ``report`` callback as a report of docs/agent-protocol.md.

1. A new replica is ``pending`` while its weights are resolved (in a thread of its
   own), ``loading`` with a progress while they download, ``starting`` once its engine
   runs, ``loading`` while the engine says it is not ready (llama-server's /health
   answers 503; vLLM does not listen yet), ``ready`` once /health answers 200.
2. Not ready within the replica's startup timeout: ``failed``, with the reason, and the
   engine is stopped. It stays failed until the operator restarts it (a higher
   generation).
3. An engine that exits on its own is restarted after 1, 2, 4 … 60 s; meanwhile it is
   ``failed`` with the exit code, its last line of output and when it restarts, and
   after five restarts in ten minutes the reason says it is a crash loop.
4. A replica no longer desired, or desired at a higher generation, is stopped: SIGTERM to
   its process group, a grace period, then SIGKILL.

Engines run in sessions of their own, so they outlive the agent: the supervisor records
each one it starts in the state folder (agent.state), and a new supervisor adopts those
still running rather than starting them a second time.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent import state, weights
from agent.engines import CommandError, command_for, extra_port_offsets

log = logging.getLogger(__name__)

DEFAULT_GRACE_S = 10.0
DEFAULT_STARTUP_TIMEOUT_S = 600.0
BACKOFF_CAP_S = 60.0
CRASH_WINDOW_S = 600.0
CRASH_LOOP_RESTARTS = 5
# How often a download's progress is reported at most: the control plane needs to see
# it move, not every megabyte.
PROGRESS_EVERY_S = 1.0
HEALTH_TIMEOUT_S = 1.0
LEADER_POLL_S = 1.0

Report = Callable[[dict[str, Any]], None]
# What a log line or a reason shows in place of an engine key.
KEY_SHOWN = "[engine key]"
# The engine's log a report carries (docs/agent-protocol.md): its last lines, each cut to
# a length, read from at most the file's last bytes; sent again while the engine runs when
# the file grew, at most every LOG_REPORT_S.
LOG_LINES = 40
LOG_LINE_CHARS = 300
LOG_READ_BYTES = 16384
LOG_REPORT_S = 5.0
# Any llmgw secret (an engine key, a node or join token) an engine might print.
_SECRET = re.compile(r"llmgw_(?:engine|node|join)_[A-Za-z0-9_\-]+")
SECRET_SHOWN = "[secret]"


def utc_now() -> str:
    """Return the time now as the protocol writes it: ISO 8601 in UTC, to the second."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def backoff_s(recent_crashes: int, cap: float = BACKOFF_CAP_S) -> float:
    """Return how long to wait before restarting after this many recent crashes."""
    return float(min(cap, 2 ** max(0, recent_crashes - 1)))


@dataclass
class _Replica:
    """Hold what the supervisor knows of one replica it runs."""

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
        for key in {self.key, self.started_key}:
            if key:
                text = text.replace(key, KEY_SHOWN)
        return text


class Supervisor:
    """Converge this node's engines to its desired replicas and report every change."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str],
        *,
        weights_dir: str | os.PathLike[str] | None = None,
        weights_folders: Sequence[str | os.PathLike[str]] | None = None,
        weights_hosts: Sequence[str] | None = None,
        report: Report | None = None,
        binaries: Mapping[str, str] | None = None,
        engines: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        node_address: str = "",
        devices: Mapping[int, str] | None = None,
        simulated: bool = False,
        grace_s: float = DEFAULT_GRACE_S,
        poll_interval_s: float = 0.25,
        backoff_cap_s: float = BACKOFF_CAP_S,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = Path(weights_dir) if weights_dir else self.state_dir / "weights"
        # Where local sources may be (the weights folder, and any others the agent was
        # given), and the origins URL sources may name (agent.weights.check_source).
        self.weights_folders = [self.weights_dir, *(Path(f) for f in weights_folders or ())]
        self.weights_hosts = None if weights_hosts is None else list(weights_hosts)
        self.report = report or (lambda r: None)
        self.binaries = dict(binaries or {})
        # None: take every engine as installed (tests); the agent passes discovery's.
        self.engines = dict(engines) if engines is not None else None
        self.host = host
        self.node_address = node_address
        self.devices = dict(devices or {})
        self.simulated = simulated
        self.grace_s = grace_s
        self.poll_interval_s = poll_interval_s
        self.backoff_cap_s = backoff_cap_s
        self._replicas: dict[int, _Replica] = {}
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=HEALTH_TIMEOUT_S)
        self._adopt()

    # -- the public face ---------------------------------------------------------------

    def converge(self, desired: Sequence[Mapping[str, Any]]) -> None:
        """Take the node's whole desired list and converge to it.

        Start what is missing, stop what is not in it, restart what it wants at a
        higher generation.
        """
        with self._lock:
            wanted: dict[int, dict[str, Any]] = {int(d["id"]): dict(d) for d in desired}
            for rid, spec in wanted.items():
                r = self._replicas.get(rid)
                generation = int(spec.get("generation") or 0)
                if r is None:
                    self._create(spec)
                elif generation < r.generation:
                    continue  # a list older than what this replica already runs
                elif r.phase == "stop":
                    # Wanted again while it stops: start it once stopped, unless it is
                    # stopping because it failed, which only a new generation undoes.
                    if r.fail_reason is None or generation > r.generation:
                        r.next = spec
                elif generation > r.generation:
                    r.next = spec
                    self._begin_stop(
                        r,
                        f"generation {r.generation} → {generation}: restarting at the operator's request",
                    )
                elif generation == r.generation:
                    r.desired = spec
                    if r.phase == "run" and r.started_key and r.started_key != r.key:
                        # The gateway now calls it with the new key, which it would refuse.
                        r.next = spec
                        self._begin_stop(
                            r, "its engine key changed: restarting it with the new one"
                        )
            for rid, r in list(self._replicas.items()):
                if rid in wanted:
                    continue
                r.next = None
                r.fail_reason = None
                if r.phase != "stop":
                    self._begin_stop(r, "no longer desired on this node")

    def tick(self) -> None:
        """Move every replica one step towards what is desired of it."""
        polls: list[tuple[_Replica, int, str | None, int | None]] = []
        with self._lock:
            for r in list(self._replicas.values()):
                self._step(r)
                if r.phase == "run" and r.state in ("starting", "loading") and r.port:
                    polls.append((r, r.port, r.health_path, r.pid, r.started_key))
        # Outside the lock: an engine slow to answer must not hold up converge.
        results = [(r, pid, self._health(port, path, key)) for r, port, path, pid, key in polls]
        with self._lock:
            for r, pid, answer in results:
                if self._replicas.get(r.id) is r and r.pid == pid and r.phase == "run":
                    self._on_health(r, answer)

    def start(self) -> None:
        """Tick in a thread of the supervisor's own until ``close``."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
            self._thread.start()

    def stop_ticking(self) -> None:
        """Stop the thread ``start`` started; ``tick`` still works when called."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def close(self) -> None:
        """Stop ticking, leaving the engines running (a new supervisor adopts them)."""
        self.stop_ticking()
        self._http.close()

    def stop_all(self, timeout_s: float | None = None) -> None:
        """Stop every engine and wait until they are gone (or the timeout passes)."""
        with self._lock:
            for r in list(self._replicas.values()):
                r.next = None
                if r.phase != "stop":
                    self._begin_stop(r, "the agent is shutting down")
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else self.grace_s + 5)
        while time.monotonic() < deadline:
            self.tick()
            with self._lock:
                if not self._replicas:
                    return
            time.sleep(0.05)

    def states(self) -> dict[int, dict[str, Any]]:
        """Return each replica's last report, by replica id."""
        with self._lock:
            return {rid: self._report_of(r) for rid, r in self._replicas.items()}

    def sources(self) -> list[str]:
        """Return the local-path sources this node runs from: it holds those weights."""
        with self._lock:
            return sorted(
                {
                    str(r.desired.get("source"))
                    for r in self._replicas.values()
                    if r.desired.get("source")
                    and weights.kind(str(r.desired["source"])) == "path"
                    and self._readable(str(r.desired["source"]))
                }
            )

    def _readable(self, source: str) -> bool:
        """Return whether a local source is in a weights folder and there."""
        try:
            weights.check_source(source, self.weights_folders, self.weights_hosts)
        except weights.WeightsError:
            return False
        return os.path.exists(os.path.expanduser(source))

    # -- the steps ---------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_interval_s):
            try:
                self.tick()
            except Exception:
                # One bad tick must not stop the watching of every engine.
                log.exception("supervisor tick failed")

    def _create(self, spec: dict[str, Any], reason: str = "placed on this node") -> _Replica:
        r = _Replica(desired=spec)
        self._replicas[r.id] = r
        refusal = self._refusal(spec)
        if refusal:
            r.phase = "done"
            self._set(r, "failed", refusal)
            return r
        self._set(r, "pending", reason)
        self._prepare(r)
        return r

    def _refusal(self, spec: Mapping[str, Any]) -> str | None:
        """Return why this node cannot run a replica at all, or None."""
        engine = str(spec.get("engine", ""))
        if self.simulated and spec.get("cards") and engine != "sim":
            return f'this node\'s cards are simulated (--simulate): only sim engines run on them, not "{engine}"'
        if self.engines is not None and engine not in self.engines:
            have = ", ".join(sorted(self.engines)) or "none"
            return f'engine "{engine}" is not installed on this node (installed: {have})'
        return None

    def _prepare(self, r: _Replica) -> None:
        r.phase = "prepare"
        r.prepared = None
        r.prep_error = None
        r.cancel = threading.Event()
        r.prep_thread = threading.Thread(
            target=self._resolve, args=(r,), name=f"weights-{r.id}", daemon=True
        )
        r.prep_thread.start()

    def _resolve(self, r: _Replica) -> None:
        """Resolve a replica's weights and adapters (in its own thread: may download)."""
        spec = r.desired
        engine = str(spec.get("engine", ""))

        def progress(done: int, total: int | None) -> None:
            self._on_progress(r, done, total)

        try:
            path = weights.resolve(
                str(spec.get("source") or ""),
                engine,
                self.weights_dir,
                sha256=spec.get("sha256") or None,
                progress=progress,
                cancel=r.cancel,
                folders=self.weights_folders,
                hosts=self.weights_hosts,
            )
            adapters = {
                str(a["name"]): weights.resolve(
                    str(a["source"]),
                    engine,
                    self.weights_dir,
                    cancel=r.cancel,
                    folders=self.weights_folders,
                    hosts=self.weights_hosts,
                )
                for a in spec.get("adapters") or []
            }
            adapter_dir = ""
            if engine == "vllm" and int(spec.get("max_loaded_adapters") or 0) > 0:
                adapter_dir = str(self._adapter_dir(r.id, adapters))
            r.prepared = (path, adapters, adapter_dir)
        except weights.WeightsError as exc:
            r.prep_error = exc
        except Exception as exc:
            r.prep_error = weights.WeightsError(f"preparing the weights failed: {exc}")

    def _adapter_dir(self, rid: int, adapters: Mapping[str, str]) -> Path:
        """Return a folder holding each adapter under its name, for vLLM to find by name."""
        folder = self.state_dir / "adapters" / str(rid)
        folder.mkdir(parents=True, exist_ok=True)
        for name, path in adapters.items():
            link = folder / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(os.path.abspath(path))
        return folder

    def _on_progress(self, r: _Replica, done: int, total: int | None) -> None:
        with self._lock:
            if self._replicas.get(r.id) is not r or r.phase != "prepare":
                return
            now = time.monotonic()
            if total and done < total and now - r.last_progress_report < PROGRESS_EVERY_S:
                return
            r.last_progress_report = now
            fraction = min(1.0, done / total) if total else None
            size = f" of {_size(total)}" if total else ""
            self._set(r, "loading", f"downloading weights: {_size(done)}{size}", fraction)

    def _step(self, r: _Replica) -> None:
        now = time.monotonic()
        if r.phase == "prepare":
            if r.prep_thread is not None and r.prep_thread.is_alive():
                return
            if r.prep_error is not None:
                self._on_prepare_failed(r, r.prep_error)
            else:
                self._launch(r)
        elif r.phase == "wait":
            if now >= r.next_start:
                if r.reprepare or r.prepared is None:
                    r.reprepare = False
                    self._set(r, "pending", "fetching the weights again")
                    self._prepare(r)
                else:
                    self._launch(r)
        elif r.phase == "run":
            code = self._exit_code(r)
            if code is not _ALIVE:
                self._on_exit(r, code)
                return
            if r.state in ("starting", "loading"):
                limit = float(r.desired.get("startup_timeout_s") or DEFAULT_STARTUP_TIMEOUT_S)
                if now - r.started_mono > limit:
                    tail = r.redact(_last_line(state.log_path(self.state_dir, r.id)))
                    reason = f"not ready within the startup timeout of {limit:g} s"
                    if tail:
                        reason += f"; last output: {tail}"
                    self._set(r, "failed", reason)
                    r.fail_reason = reason
                    self._signal(r, signal.SIGTERM)
                    r.phase = "stop"
                    r.stop_deadline = now + self.grace_s
                    return
            self._report_log(r, now)
        elif r.phase == "stop":
            if r.prep_thread is not None and r.prep_thread.is_alive():
                return
            if r.pid is None or self._exit_code(r) is not _ALIVE:
                self._finish_stop(r)
            elif not r.killed and now >= r.stop_deadline:
                self._signal(r, signal.SIGKILL)
                r.killed = True

    def _on_prepare_failed(self, r: _Replica, error: weights.WeightsError) -> None:
        if not error.retry:
            r.phase = "done"
            self._set(r, "failed", str(error))
            return
        r.crashes.append(time.monotonic())
        delay = self._backoff(r)
        r.reprepare = True
        r.phase = "wait"
        r.next_start = time.monotonic() + delay
        self._set(r, "failed", _reason(error, f"retrying in {delay:g} s"))

    def _launch(self, r: _Replica) -> None:
        assert r.prepared is not None
        path, adapters, adapter_dir = r.prepared
        if _awaits_leader(r.desired):
            # Rank 0 has not reported its port yet: the next desired list names it.
            r.phase = "wait"
            r.next_start = time.monotonic() + LEADER_POLL_S
            self._set(r, "pending", "waiting for rank 0 of this replica to report its address")
            return
        try:
            # The same port again after a crash, while free: routes to it stay right.
            port = _free_port(self.host, extra_port_offsets(r.desired), prefer=r.port)
            command = command_for(
                r.desired,
                port,
                path,
                self.binaries,
                host=self.host,
                node_address=self.node_address,
                adapters=adapters,
                devices=self.devices,
                adapter_dir=adapter_dir,
            )
        except (CommandError, OSError) as exc:
            r.phase = "done"
            self._set(r, "failed", str(exc))
            return
        for warning in command.warnings:
            log.warning("replica %s: %s", r.id, warning)
        log_file = state.log_path(self.state_dir, r.id)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        r.argv = command.argv
        r.port = port
        r.health_path = command.health_path
        r.started_key = r.key
        r.launching = True
        self._save()
        try:
            # Readable by the agent's user only: an engine may print its key (SGLang).
            fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with open(fd, "ab") as out:
                shown = r.redact(str(command.argv))
                out.write(f"--- {utc_now()} generation {r.generation}: {shown}\n".encode())
                out.flush()
                proc = subprocess.Popen(
                    command.argv,
                    env={**os.environ, **command.env},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=self.state_dir,
                    # A session of its own: the engine outlives the agent, and a stop
                    # reaches every process it started through its group.
                    start_new_session=True,
                )
        except OSError as exc:
            r.launching = False
            self._save()
            r.phase = "done"
            self._set(r, "failed", f"could not start {command.argv[0]}: {exc.strerror or exc}")
            return
        r.launching = False
        r.proc = proc
        r.pid = proc.pid
        r.start_ticks = _start_ticks(proc.pid)
        r.started_wall = time.time()
        r.started_mono = time.monotonic()
        r.phase = "run"
        r.killed = False
        r.fail_reason = None
        self._save()
        engine = r.desired.get("engine", "")
        again = f" (restart {r.restarts})" if r.restarts else ""
        self._set(r, "starting", f"started {engine}{again}: pid {proc.pid}, port {port}")

    def _on_health(self, r: _Replica, answer: int | None) -> None:
        if r.health_path is None:
            self._set(r, "ready", "running; rank 0 serves this multi-node replica")
        elif answer == 200:
            why = "the engine answers /health"
            if r.key and not r.started_key:
                why += (
                    "; started before engine keys, its port answers any caller until the "
                    "replica is restarted"
                )
            self._set(r, "ready", why)
        else:
            why = (
                "the engine is loading the model"
                if answer == 503
                else "the engine is loading the model (not listening yet)"
            )
            self._set(r, "loading", why)

    def _on_exit(self, r: _Replica, code: int | None) -> None:
        self._reap_group(r)
        r.proc = None
        r.pid = None
        self._save()
        tail = r.redact(_last_line(state.log_path(self.state_dir, r.id)))
        if code is None:
            why = "exited (found running after an agent restart, so its exit code is unknown)"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = str(-code)
            why = f"killed by signal {-code} ({name})"
            if -code in (signal.SIGKILL, signal.SIGTERM):
                # Killed from outside: its last line says nothing of why.
                tail = ""
        else:
            why = f"exited with code {code}"
        if tail:
            why += f": {tail}"
        now = time.monotonic()
        r.crashes.append(now)
        delay = self._backoff(r)
        recent = len(r.crashes)
        r.restarts += 1
        r.phase = "wait"
        r.next_start = now + delay
        if recent >= CRASH_LOOP_RESTARTS:
            why = f"crash loop: {recent} restarts in {CRASH_WINDOW_S / 60:g} min; last {why}"
        self._set(r, "failed", f"{why}; restarting in {delay:g} s")

    def _backoff(self, r: _Replica) -> float:
        now = time.monotonic()
        while r.crashes and now - r.crashes[0] > CRASH_WINDOW_S:
            r.crashes.popleft()
        return backoff_s(len(r.crashes), self.backoff_cap_s)

    def _begin_stop(self, r: _Replica, reason: str) -> None:
        # A stop asked for (not wanted, shutting down) ends in stopped, even for a
        # replica that failed.
        r.fail_reason = None
        r.phase = "stop"
        r.cancel.set()
        if r.pid is not None:
            self._signal(r, signal.SIGTERM)
            r.stop_deadline = time.monotonic() + self.grace_s
            r.killed = False
        if r.state != "failed" or r.pid is not None:
            self._set(r, "stopping", reason)
        else:
            r.reason = reason

    def _finish_stop(self, r: _Replica) -> None:
        """Record that a replica's engine is gone, and start its next generation if any."""
        self._reap_group(r)
        r.proc = None
        r.pid = None
        if r.fail_reason is not None and r.next is None:
            # Failed (startup timeout) and still desired at this generation: it stays
            # failed, for the operator to see, until a new generation.
            r.phase = "done"
            self._save()
            return
        del self._replicas[r.id]
        self._save()
        if r.next is not None:
            self._create(r.next, f"generation {r.next.get('generation')} replaces {r.generation}")
        else:
            self._set(r, "stopped", r.reason or "stopped")

    def _reap_group(self, r: _Replica) -> None:
        """Kill what is left of an engine's processes once it is gone.

        vLLM's workers, for one, outlive a main process killed hard, and hold cards and
        ports.
        """
        if r.pid is None:
            return
        if r.proc is not None:
            r.proc.poll()
        if r.start_ticks is not None:
            _kill_leftovers(r.pid, r.start_ticks)
        else:
            self._signal(r, signal.SIGKILL)

    def _signal(self, r: _Replica, sig: signal.Signals) -> None:
        if r.pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(r.pid, sig)

    def _exit_code(self, r: _Replica) -> int | None | object:
        """Return _ALIVE while the engine runs, else its exit code (None: unknown)."""
        if r.proc is not None:
            code = r.proc.poll()
            return _ALIVE if code is None else code
        if r.pid is not None and _process_alive(r.pid, r.start_ticks):
            return _ALIVE
        return None

    def _health(self, port: int, path: str | None, key: str = "") -> int | None:
        if path is None:
            return None
        host = "127.0.0.1" if self.host in ("0.0.0.0", "", "::") else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        # Every engine answers /health without its key; the key goes along all the same,
        # as on every call to an engine's port.
        headers = {"Authorization": f"Bearer {key}"} if key else None
        try:
            return self._http.get(f"http://{host}:{port}{path}", headers=headers).status_code
        except httpx.HTTPError:
            return None

    # -- reports and the record --------------------------------------------------------

    def _set(
        self,
        r: _Replica,
        state_name: str,
        reason: str,
        progress: float | None = None,
    ) -> None:
        if (state_name, reason, progress) == (r.state, r.reason, r.progress):
            return
        r.state = state_name
        r.reason = reason
        r.progress = progress
        log.info("replica %s gen %s: %s (%s)", r.id, r.generation, state_name, reason)
        with contextlib.suppress(OSError):
            r.log_size = state.log_path(self.state_dir, r.id).stat().st_size
        try:
            self.report(self._report_of(r))
        except Exception:
            log.exception("reporting replica %s failed", r.id)

    def _log_of(self, r: _Replica) -> list[str]:
        """The engine's last lines, every secret masked (the replica's keys, any llmgw token)."""
        path = state.log_path(self.state_dir, r.id)
        return [_SECRET.sub(SECRET_SHOWN, r.redact(line)) for line in _tail(path)]

    def _report_log(self, r: _Replica, now: float) -> None:
        """Report a running engine's log again when it grew (at most every LOG_REPORT_S)."""
        if now - r.log_reported < LOG_REPORT_S:
            return
        try:
            size = state.log_path(self.state_dir, r.id).stat().st_size
        except OSError:
            return
        r.log_reported = now
        if size == r.log_size:
            return
        r.log_size = size
        try:
            self.report(self._report_of(r))
        except Exception:
            log.exception("reporting replica %s failed", r.id)

    def _report_of(self, r: _Replica) -> dict[str, Any]:
        return {
            "replica": r.id,
            "generation": r.generation,
            "state": r.state,
            "reason": r.reason,
            "progress": r.progress,
            "port": r.port if r.state not in ("stopped", "pending") else None,
            "pid": r.pid,
            "restarts": r.restarts,
            "at": utc_now(),
            "log": self._log_of(r),
        }

    def _save(self) -> None:
        records = {
            rid: {
                "replica": rid,
                "generation": r.generation,
                "pid": r.pid,
                "start_ticks": r.start_ticks,
                "port": r.port,
                "started_at": r.started_wall,
                "argv": r.argv,
                "health_path": r.health_path,
                "restarts": r.restarts,
                "desired": r.desired,
                "started_key": r.started_key,
            }
            for rid, r in self._replicas.items()
            if r.pid is not None or r.launching
        }
        state.save_engines(self.state_dir, records)

    def _adopt(self) -> None:
        """Take over the engines a previous agent started, or start dead ones again.

        An engine is the same one when its pid is alive and the process started at the
        recorded time (its start time since boot, from /proc), or, with no start time
        recorded, runs the recorded command line. A pid reused by another process is
        neither, and is left alone.
        """
        for rid, rec in state.load_engines(self.state_dir).items():
            spec = rec.get("desired")
            if not isinstance(spec, dict) or int(spec.get("id", -1)) != rid:
                continue
            r = _Replica(desired=spec, restarts=int(rec.get("restarts") or 0))
            pid = rec.get("pid")
            ticks = rec.get("start_ticks")
            argv = list(rec.get("argv") or [])
            self._replicas[rid] = r
            if pid is None and argv:
                # Started, but its pid never recorded: find it by its command line.
                pid = _find_session_leader(argv)
                ticks = _start_ticks(pid) if pid is not None else None
            if isinstance(pid, int) and _is_our_engine(pid, ticks, argv):
                r.pid = pid
                r.start_ticks = ticks
                r.argv = argv
                r.port = rec.get("port")
                r.health_path = rec.get("health_path")
                # A record from before engine keys has none: that engine asks for none.
                r.started_key = str(rec.get("started_key") or "")
                r.started_wall = float(rec.get("started_at") or time.time())
                r.started_mono = time.monotonic() - max(0.0, time.time() - r.started_wall)
                r.phase = "run"
                r.state = "starting"
                self._set(
                    r,
                    "loading",
                    f"found running after the agent restarted (pid {pid}); checking it is ready",
                )
            else:
                if isinstance(pid, int) and ticks is not None:
                    _kill_leftovers(pid, ticks)
                self._set(
                    r, "pending", "was not running when the agent restarted: starting it again"
                )
                refusal = self._refusal(spec)
                if refusal:
                    r.phase = "done"
                    self._set(r, "failed", refusal)
                else:
                    self._prepare(r)
        self._save()


_ALIVE = object()


def _awaits_leader(spec: Mapping[str, Any]) -> bool:
    """Return whether a rank of a multi-node replica is still missing its leader's port."""
    if int(spec.get("nodes") or 1) <= 1 or int(spec.get("rank") or 0) == 0:
        return False
    if spec.get("engine") == "sim":
        return False  # the simulator's ranks serve on their own
    _, sep, port = str(spec.get("leader") or "").rpartition(":")
    return not (sep and port.isdigit())


def _stat_fields(pid: int) -> list[str] | None:
    """Return /proc/<pid>/stat's fields from the state on (after the command's name)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def _start_ticks(pid: int) -> int | None:
    """Return when a process started, in clock ticks since boot: with its pid, unique."""
    fields = _stat_fields(pid)
    # Field 22 of stat is the start time; fields here begin at field 3 (the state).
    return int(fields[19]) if fields and len(fields) > 19 else None


def _process_alive(pid: int, start_ticks: int | None) -> bool:
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return start_ticks is None or _start_ticks(pid) == start_ticks


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def _is_our_engine(pid: int, start_ticks: int | None, argv: list[str]) -> bool:
    """Return whether a recorded pid is still the engine the record describes.

    The start time decides when recorded: engines such as vLLM rename their processes,
    which changes what /proc shows as the command line but not when they started.
    """
    if not _process_alive(pid, None):
        return False
    if start_ticks is not None:
        return _start_ticks(pid) == start_ticks
    return _cmdline(pid) == argv


def _find_session_leader(argv: list[str]) -> int | None:
    """Return the pid of a session leader running exactly this command line, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if (
            fields
            and len(fields) > 3
            and fields[3] == entry.name
            and _cmdline(int(entry.name)) == argv
        ):
            return int(entry.name)
    return None


def _kill_leftovers(leader: int, leader_ticks: int) -> None:
    """Kill what remains of a dead engine's session (its workers hold cards and ports).

    Only processes in the engine's session that started no earlier than the engine did
    are its own: a session id is the leader's pid, which may since have been reused.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # After the state: ppid, pgrp, session …; the start time is index 19.
        if not fields or len(fields) < 20 or fields[3] != str(leader):
            continue
        if int(fields[19]) >= leader_ticks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def _free_port(host: str, offsets: Sequence[int], prefer: int | None = None) -> int:
    """Return a port free on this host, with the ports at these offsets from it free too."""
    bind_host = "127.0.0.1" if host in ("", "0.0.0.0") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    if prefer and all(_port_free(bind_host, family, prefer + off) for off in (0, *offsets)):
        return prefer
    for _ in range(100):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((bind_host, 0))
            port = int(s.getsockname()[1])
        if all(_port_free(bind_host, family, port + off) for off in offsets):
            return port
    raise OSError(f"no free port with {len(offsets)} free beside it on {bind_host}")


def _port_free(host: str, family: socket.AddressFamily, port: int) -> bool:
    if port > 65535:
        return False
    with socket.socket(family, socket.SOCK_STREAM) as s:
        # As the engines bind: a port whose last connections linger in TIME_WAIT is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _last_line(path: Path, limit: int = 300) -> str:
    """Return the last line an engine wrote, which most often says why it stopped."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line and not line.startswith("--- "):
            return line[:limit]
    return ""


def _tail(path: Path) -> list[str]:
    """Return an engine's last lines (stdout and stderr, as it wrote them), bounded."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_READ_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = text.splitlines()
    if size > LOG_READ_BYTES and len(lines) > 1:
        lines = lines[1:]  # the first is most likely cut
    return [line[:LOG_LINE_CHARS] for line in lines if line.strip()][-LOG_LINES:]


def _size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _reason(error: Exception, then: str) -> str:
    """Return an error's reason with what happens next (before a weights error's detail)."""
    if isinstance(error, weights.WeightsError):
        return error.reason(then)
    return f"{error}; {then}"
