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
5. A ready engine is watched: its health read every 2 s with a 2 s timeout
   (``agent.watch``); one that answers nothing three times in a row (stopped, wedged) is
   ``failed``, "not answering", out of routing while its process runs on, and ``ready``
   again at its first answer.

Engines run in sessions of their own, so they outlive the agent: the supervisor records
each one it starts in the state folder (agent.state), and a new supervisor adopts those
still running rather than starting them a second time.

Where the parts are: ``agent.replica`` (what the supervisor knows of a replica, its report
and its record), ``agent.preparing`` (its weights and adapters, resolved in a thread),
``agent.processes`` (an engine's processes: started, found again, signalled, reaped; its
port; its health), ``agent.enginelog`` (its log's last lines, secrets masked).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from agent import enginelog, preparing, processes, state, watch, weights
from agent.engines import CommandError, command_for, extra_port_offsets
from agent.replica import Replica, utc_now

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
# A running engine's log (agent.enginelog) is reported again when its file grew, at most
# every LOG_REPORT_S.
LOG_REPORT_S = 5.0


def backoff_s(recent_crashes: int, cap: float = BACKOFF_CAP_S) -> float:
    """Return how long to wait before restarting after this many recent crashes."""
    return float(min(cap, 2 ** max(0, recent_crashes - 1)))


class Supervisor:
    """Converge this node's engines to its desired replicas and report every change."""

    # A ready engine's watch (agent.watch): how often its health is read, how long a read
    # waits, how many reads in a row without a 200 report it hung.
    watch_every_s = watch.EVERY_S
    watch_timeout_s = watch.TIMEOUT_S
    watch_hung_after = watch.HUNG_AFTER

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
        mirror: Any = None,
    ) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.weights_dir = Path(weights_dir) if weights_dir else self.state_dir / "weights"
        # Where local sources may be (the weights folder, and any others the agent was
        # given), and the origins URL sources may name (agent.weights.check_source).
        self.weights_folders = [self.weights_dir, *(Path(f) for f in weights_folders or ())]
        self.weights_hosts = None if weights_hosts is None else list(weights_hosts)
        # The control plane's weights mirror (agent.mirror.MirrorClient), or None: sources
        # fetched by this node itself.
        self.mirror = mirror
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
        self._replicas: dict[int, Replica] = {}
        self._lock = threading.RLock()
        self._halt = threading.Event()
        self._thread: threading.Thread | None = None
        self._http = httpx.Client(timeout=HEALTH_TIMEOUT_S)
        self._watches: dict[int, watch.Watch] = {}
        self._watch_pool: ThreadPoolExecutor | None = None
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
                        f"generation {r.generation} → {generation}: restarting (an operator's restart, or placed here again after an eviction)",
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
        polls: list[tuple[Replica, int, str | None, int | None]] = []
        with self._lock:
            for r in list(self._replicas.values()):
                self._step(r)
                if r.phase == "run" and r.state in ("starting", "loading") and r.port:
                    polls.append((r, r.port, r.health_path, r.pid, r.started_key))
        # Outside the lock: an engine slow to answer must not hold up converge.
        results = [
            (r, pid, processes.health(self._http, self.host, port, path, key))
            for r, port, path, pid, key in polls
        ]
        with self._lock:
            for r, pid, answer in results:
                if self._replicas.get(r.id) is r and r.pid == pid and r.phase == "run":
                    self._on_health(r, answer)
        self._watch_ready()

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
        if self._watch_pool is not None:
            self._watch_pool.shutdown(wait=False, cancel_futures=True)

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
            return {rid: r.report(self._log_of(r)) for rid, r in self._replicas.items()}

    def sources(self) -> list[str]:
        """Return the local-path sources this node runs from: it holds those weights."""
        with self._lock:
            return sorted(
                {
                    str(r.desired.get("source"))
                    for r in self._replicas.values()
                    if r.desired.get("source")
                    and weights.kind(str(r.desired["source"])) == "path"
                    and preparing.readable(
                        str(r.desired["source"]), self.weights_folders, self.weights_hosts
                    )
                }
            )

    # -- the steps ---------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._halt.wait(self.poll_interval_s):
            try:
                self.tick()
            except Exception:
                # One bad tick must not stop the watching of every engine.
                log.exception("supervisor tick failed")

    def _create(self, spec: dict[str, Any], reason: str = "placed on this node") -> Replica:
        r = Replica(desired=spec)
        self._replicas[r.id] = r
        refusal = _refusal(spec, self.simulated, self.engines)
        if refusal:
            r.phase = "done"
            self._set(r, "failed", refusal)
            return r
        self._set(r, "pending", reason)
        self._prepare(r)
        return r

    def _prepare(self, r: Replica) -> None:
        r.phase = "prepare"
        r.prepared = None
        r.prep_error = None
        r.cancel = threading.Event()
        r.prep_thread = threading.Thread(
            target=self._resolve, args=(r,), name=f"weights-{r.id}", daemon=True
        )
        r.prep_thread.start()

    def _resolve(self, r: Replica) -> None:
        """Resolve a replica's weights and adapters (in its own thread: may download)."""

        def progress(done: int, total: int | None) -> None:
            self._on_progress(r, done, total)

        try:
            r.prepared = preparing.prepare(
                r.desired,
                self.weights_dir,
                self.weights_folders,
                self.weights_hosts,
                self.state_dir / "adapters" / str(r.id),
                r.cancel,
                progress,
                mirror=self.mirror,
            )
        except weights.WeightsError as exc:
            r.prep_error = exc
        except Exception as exc:
            r.prep_error = weights.WeightsError(f"preparing the weights failed: {exc}")

    def _on_progress(self, r: Replica, done: int, total: int | None) -> None:
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

    def _step(self, r: Replica) -> None:
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
            code = processes.exit_code(r.proc, r.pid, r.start_ticks)
            if code is not processes.ALIVE:
                self._on_exit(r, code)
                return
            if r.state in ("starting", "loading"):
                limit = float(r.desired.get("startup_timeout_s") or DEFAULT_STARTUP_TIMEOUT_S)
                if now - r.started_mono > limit:
                    tail = r.redact(enginelog.last_line(state.log_path(self.state_dir, r.id)))
                    reason = f"not ready within the startup timeout of {limit:g} s"
                    if tail:
                        reason += f"; last output: {tail}"
                    self._set(r, "failed", reason)
                    r.fail_reason = reason
                    processes.signal_group(r.pid, signal.SIGTERM)
                    r.phase = "stop"
                    r.stop_deadline = now + self.grace_s
                    return
            self._report_log(r, now)
        elif r.phase == "stop":
            if r.prep_thread is not None and r.prep_thread.is_alive():
                return
            if (
                r.pid is None
                or processes.exit_code(r.proc, r.pid, r.start_ticks) is not processes.ALIVE
            ):
                self._finish_stop(r)
            elif not r.killed and now >= r.stop_deadline:
                processes.signal_group(r.pid, signal.SIGKILL)
                r.killed = True

    def _on_prepare_failed(self, r: Replica, error: weights.WeightsError) -> None:
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

    def _launch(self, r: Replica) -> None:
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
            port = processes.free_port(self.host, extra_port_offsets(r.desired), prefer=r.port)
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
            header = f"{utc_now()} generation {r.generation}: {r.redact(str(command.argv))}"
            proc = processes.spawn(command.argv, command.env, log_file, header, self.state_dir)
        except OSError as exc:
            r.launching = False
            self._save()
            r.phase = "done"
            self._set(r, "failed", f"could not start {command.argv[0]}: {exc.strerror or exc}")
            return
        r.launching = False
        r.proc = proc
        r.pid = proc.pid
        r.start_ticks = processes.start_ticks(proc.pid)
        r.started_wall = time.time()
        r.started_mono = time.monotonic()
        r.phase = "run"
        r.killed = False
        r.fail_reason = None
        self._save()
        engine = r.desired.get("engine", "")
        again = f" (restart {r.restarts})" if r.restarts else ""
        self._set(r, "starting", f"started {engine}{again}: pid {proc.pid}, port {port}")

    def _on_health(self, r: Replica, answer: int | None) -> None:
        self._set(r, *r.health_verdict(answer))

    def _on_exit(self, r: Replica, code: int | None) -> None:
        processes.reap(r.proc, r.pid, r.start_ticks)
        r.proc = None
        r.pid = None
        self._save()
        tail = r.redact(enginelog.last_line(state.log_path(self.state_dir, r.id)))
        why = processes.exit_reason(code, tail)
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

    def _backoff(self, r: Replica) -> float:
        """Return how long ``r`` waits to start again after its crashes of the window."""
        return backoff_s(r.recent_crashes(CRASH_WINDOW_S), self.backoff_cap_s)

    def _begin_stop(self, r: Replica, reason: str) -> None:
        # A stop asked for (not wanted, shutting down) ends in stopped, even for a
        # replica that failed.
        r.fail_reason = None
        r.phase = "stop"
        r.cancel.set()
        if r.pid is not None:
            processes.signal_group(r.pid, signal.SIGTERM)
            r.stop_deadline = time.monotonic() + self.grace_s
            r.killed = False
        if r.state != "failed" or r.pid is not None:
            self._set(r, "stopping", reason)
        else:
            r.reason = reason

    def _finish_stop(self, r: Replica) -> None:
        """Record that a replica's engine is gone, and start its next generation if any."""
        processes.reap(r.proc, r.pid, r.start_ticks)
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

    # -- a ready engine's watch (agent.watch) --------------------------------------------

    def _watch_ready(self) -> None:
        """Read each ready engine's health every ``watch_every_s``, in threads of the
        watch's own (a hung engine holds a read for ``watch_timeout_s``, never the tick):
        one that stops answering is reported failed (out of routing) while its process
        runs on, and ready again once it answers."""
        now = time.monotonic()
        with self._lock:
            for rid, w in list(self._watches.items()):
                r = self._replicas.get(rid)
                if r is None or r.phase != "run" or r.pid != w.pid or not (
                    r.state == "ready" or w.hung and r.state == "failed"
                ):  # fmt: skip
                    del self._watches[rid]  # stopped, exited, restarted: watched afresh
            for r in self._replicas.values():
                if r.phase != "run" or r.pid is None or not r.port or r.health_path is None:
                    continue
                w = self._watches.get(r.id)
                if w is None:
                    if r.state != "ready":
                        continue
                    w = self._watches[r.id] = watch.Watch(r.pid, now + self.watch_every_s)
                if w.reading is not None:
                    if not w.reading.done():
                        continue
                    failed = w.reading.cancelled() or w.reading.exception() is not None
                    answer = None if failed else w.reading.result()
                    w.reading = None
                    change = watch.answered(w, answer, timeout_s=self.watch_timeout_s,
                                            after=self.watch_hung_after)  # fmt: skip
                    if change is not None:
                        self._set(r, *change)
                if now >= w.due:
                    w.due = now + self.watch_every_s
                    w.sent = time.time()
                    w.reading = self._watch_threads().submit(
                        self._read_health, r.port, r.health_path, r.started_key
                    )

    def _watch_threads(self) -> ThreadPoolExecutor:
        if self._watch_pool is None:
            self._watch_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="watch")
        return self._watch_pool

    def _read_health(self, port: int, path: str, key: str) -> int | None:
        """One read of an engine's health, bounded by ``watch_timeout_s`` (a client of its
        own: the reads run in several threads)."""
        with httpx.Client(timeout=self.watch_timeout_s) as http:
            return processes.health(http, self.host, port, path, key)

    # -- reports and the record --------------------------------------------------------

    def _set(
        self,
        r: Replica,
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
            self.report(r.report(self._log_of(r)))
        except Exception:
            log.exception("reporting replica %s failed", r.id)

    def _log_of(self, r: Replica) -> list[str]:
        """The engine's last lines, every secret masked (the replica's keys, any llmgw token)."""
        path = state.log_path(self.state_dir, r.id)
        return [enginelog.mask_secrets(r.redact(line)) for line in enginelog.tail(path)]

    def _report_log(self, r: Replica, now: float) -> None:
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
            self.report(r.report(self._log_of(r)))
        except Exception:
            log.exception("reporting replica %s failed", r.id)

    def _save(self) -> None:
        records = {
            rid: r.record() for rid, r in self._replicas.items() if r.pid is not None or r.launching
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
            r = Replica(desired=spec, restarts=int(rec.get("restarts") or 0))
            argv = list(rec.get("argv") or [])
            self._replicas[rid] = r
            found = processes.find_recorded(rec.get("pid"), rec.get("start_ticks"), argv)
            if found is not None:
                pid, ticks = found
                r.adopt(rec, pid, ticks)
                self._set(
                    r,
                    "loading",
                    f"found running after the agent restarted (pid {pid}); checking it is ready",
                )
            else:
                self._set(
                    r, "pending", "was not running when the agent restarted: starting it again"
                )
                refusal = _refusal(spec, self.simulated, self.engines)
                if refusal:
                    r.phase = "done"
                    self._set(r, "failed", refusal)
                else:
                    self._prepare(r)
        self._save()


def _refusal(
    spec: Mapping[str, Any], simulated: bool, engines: Mapping[str, str] | None
) -> str | None:
    """Return why this node cannot run a replica at all, or None."""
    engine = str(spec.get("engine", ""))
    if simulated and spec.get("cards") and engine != "sim":
        return f'this node\'s cards are simulated (--simulate): only sim engines run on them, not "{engine}"'
    if engines is not None and engine not in engines:
        have = ", ".join(sorted(engines)) or "none"
        return f'engine "{engine}" is not installed on this node (installed: {have})'
    return None


def _awaits_leader(spec: Mapping[str, Any]) -> bool:
    """Return whether a rank of a multi-node replica is still missing its leader's port."""
    if int(spec.get("nodes") or 1) <= 1 or int(spec.get("rank") or 0) == 0:
        return False
    if spec.get("engine") == "sim":
        return False  # the simulator's ranks serve on their own
    _, sep, port = str(spec.get("leader") or "").rpartition(":")
    return not (sep and port.isdigit())


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
