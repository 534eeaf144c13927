"""An engine's processes as the operating system sees them: started, found, signalled, gone.

Engines run in sessions of their own, so they outlive the agent; a process is told from
another that reused its pid by when it started (its start time since boot, from /proc).
No Django here: the supervisor (agent.supervisor) calls these.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

# What ``exit_code`` returns while the engine runs.
ALIVE = object()


def spawn(
    argv: list[str], env: Mapping[str, str], log_file: Path, header: str, cwd: Path
) -> subprocess.Popen[bytes]:
    """Start an engine in a session of its own, its output appended to its log file.

    The log is readable by the agent's user only (an engine may print its key: SGLang),
    and each start is marked in it by a ``--- `` header line. Raises OSError.
    """
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "ab") as out:
        out.write(f"--- {header}\n".encode())
        out.flush()
        return subprocess.Popen(
            argv,
            env={**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            # A session of its own: the engine outlives the agent, and a stop reaches
            # every process it started through its group.
            start_new_session=True,
        )


def exit_code(
    proc: subprocess.Popen[bytes] | None, pid: int | None, start_ticks: int | None
) -> int | None | object:
    """Return ``ALIVE`` while the engine runs, else its exit code (None: unknown, as for an
    engine adopted from an earlier agent, which is not its parent)."""
    if proc is not None:
        code = proc.poll()
        return ALIVE if code is None else code
    if pid is not None and process_alive(pid, start_ticks):
        return ALIVE
    return None


def signal_group(pid: int | None, sig: signal.Signals) -> None:
    """Send a signal to an engine's process group (nothing when it is gone)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def reap(proc: subprocess.Popen[bytes] | None, pid: int | None, start_ticks: int | None) -> None:
    """Kill what is left of an engine's processes once it is gone.

    vLLM's workers, for one, outlive a main process killed hard, and hold cards and ports.
    """
    if pid is None:
        return
    if proc is not None:
        proc.poll()
    if start_ticks is not None:
        kill_leftovers(pid, start_ticks)
    else:
        signal_group(pid, signal.SIGKILL)


def health(http: httpx.Client, host: str, port: int, path: str | None, key: str = "") -> int | None:
    """Return the status an engine's health path answers, or None (no answer, or no path)."""
    if path is None:
        return None
    host = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    # Every engine answers /health without its key; the key goes along all the same,
    # as on every call to an engine's port.
    headers = {"Authorization": f"Bearer {key}"} if key else None
    try:
        return http.get(f"http://{host}:{port}{path}", headers=headers).status_code
    except httpx.HTTPError:
        return None


def exit_reason(code: int | None, tail: str) -> str:
    """Return why an engine stopped: its exit code or signal, and its last line of output
    (not when it was killed from outside, which its last line says nothing of)."""
    if code is None:
        why = "exited (found running after an agent restart, so its exit code is unknown)"
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = str(-code)
        why = f"killed by signal {-code} ({name})"
        if -code in (signal.SIGKILL, signal.SIGTERM):
            tail = ""
    else:
        why = f"exited with code {code}"
    return f"{why}: {tail}" if tail else why


def find_recorded(pid: object, ticks: int | None, argv: list[str]) -> tuple[int, int | None] | None:
    """Return the recorded engine's pid and start time if it still runs, else None.

    A record with no pid (the agent died between starting the engine and recording it)
    is found by its command line. A dead engine's leftover processes are killed.
    """
    if pid is None and argv:
        pid = find_session_leader(argv)
        ticks = start_ticks(pid) if pid is not None else None
    if isinstance(pid, int) and is_our_engine(pid, ticks, argv):
        return pid, ticks
    if isinstance(pid, int) and ticks is not None:
        kill_leftovers(pid, ticks)
    return None


def stat_fields(pid: int) -> list[str] | None:
    """Return /proc/<pid>/stat's fields from the state on (after the command's name)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


def start_ticks(pid: int) -> int | None:
    """Return when a process started, in clock ticks since boot: with its pid, unique."""
    fields = stat_fields(pid)
    # Field 22 of stat is the start time; fields here begin at field 3 (the state).
    return int(fields[19]) if fields and len(fields) > 19 else None


def process_alive(pid: int, ticks: int | None) -> bool:
    """Return whether a process runs (not a zombie), and started at ``ticks`` if given."""
    fields = stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return False
    return ticks is None or start_ticks(pid) == ticks


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def is_our_engine(pid: int, ticks: int | None, argv: list[str]) -> bool:
    """Return whether a recorded pid is still the engine the record describes.

    The start time decides when recorded: engines such as vLLM rename their processes,
    which changes what /proc shows as the command line but not when they started.
    """
    if not process_alive(pid, None):
        return False
    if ticks is not None:
        return start_ticks(pid) == ticks
    return _cmdline(pid) == argv


def find_session_leader(argv: list[str]) -> int | None:
    """Return the pid of a session leader running exactly this command line, or None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        if (
            fields
            and len(fields) > 3
            and fields[3] == entry.name
            and _cmdline(int(entry.name)) == argv
        ):
            return int(entry.name)
    return None


def kill_leftovers(leader: int, leader_ticks: int) -> None:
    """Kill what remains of a dead engine's session (its workers hold cards and ports).

    Only processes in the engine's session that started no earlier than the engine did
    are its own: a session id is the leader's pid, which may since have been reused.
    """
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = stat_fields(int(entry.name))
        # After the state: ppid, pgrp, session …; the start time is index 19.
        if not fields or len(fields) < 20 or fields[3] != str(leader):
            continue
        if int(fields[19]) >= leader_ticks:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


def free_port(host: str, offsets: Sequence[int], prefer: int | None = None) -> int:
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
