"""Live events between the processes of the embedded mode.

With Redis (production) every process publishes to the channel layer and every web
process hears it. Embedded, the channel layer lives in the memory of the one web process,
so a change made by another process on the same data folder (a ``manage.py`` command in a
terminal, a script using the ORM) would reach no console until its socket reconnected.

So the embedded web process listens on a Unix datagram socket in the data folder,
``live.sock`` (owner-only), and hands what arrives to its channel layer; any other
process whose channel layer is in memory sends its events there after commit. Nothing listening (no web process, or one on another data folder):
the event is dropped, as it would be with no console open.

The same socket carries one more thing: ``WAKE``, a change that wants the reconciler
(``cluster.wake``), so a model imported from a terminal is placed at once, not at the
loop's next interval.

What arrives is checked before it is used (:func:`parse`): the keys-only events of
``llmgw_core.events.EVENTS`` (its group, type and keys), or ``WAKE``, and nothing else;
anything else is logged and dropped.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.conf import settings

from llmgw_core import events, lean

log = logging.getLogger(__name__)

SOCKET_NAME = "live.sock"
# An event names a few keys; a datagram this size holds thousands of them.
MAX_DATAGRAM = 65536
# sun_path holds 108 bytes on Linux, with the terminating NUL.
MAX_PATH = 107

_listening: tuple[Path, int] | None = None  # this process's socket and its inode
WAKE = b"wake: reconcile"
# What a ``WAKE`` that arrives does: ``cluster.wake.wake``, set as the app starts
# (``cluster.apps``): the wake sends through the relay, never the other way round.
on_wake: Callable[[], None] | None = None


class BadEvent(ValueError):
    """A datagram that is not one of the events ``llmgw_core.events`` publishes."""


def path(data_dir: Path | str | None = None) -> Path:
    """The socket's path in ``data_dir`` (default: the settings' data folder)."""
    if data_dir is None:
        data_dir = settings.DATA_DIR
    return Path(data_dir) / SOCKET_NAME


def encode(group: str, message: dict[str, Any]) -> bytes:
    return json.dumps({"group": group, "message": message}, separators=(",", ":")).encode()


def parse(data: bytes) -> tuple[str, dict[str, Any]]:
    """Return the group and message a datagram carries, or raise :class:`BadEvent`.

    Pure: the catalogue the publishing side follows (``llmgw_core.events.EVENTS``).
    """
    try:
        doc = lean.loads(data)
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise BadEvent(f"not JSON: {e}") from None
    if not isinstance(doc, dict) or set(doc) != {"group", "message"}:
        raise BadEvent('expected an object with "group" and "message" only')
    group, message = doc["group"], doc["message"]
    if group not in events.GROUP_OF_TYPE.values():
        raise BadEvent(f"unknown group {group!r}")
    if not isinstance(message, dict):
        raise BadEvent("message: expected an object")
    kind = message.get("type")
    event = events.BY_TYPE.get(kind) if isinstance(kind, str) else None
    if event is None or event.group != group:
        raise BadEvent(f"message.type: {kind!r} is not an event of {group}")
    keys, item = event.keys, event.item
    if set(message) != {"type", "id", keys}:
        raise BadEvent(f"message: expected type, id and {keys} only")
    if not isinstance(message["id"], str) or not 0 < len(message["id"]) <= 64:
        raise BadEvent("message.id: expected a string of 1 to 64 characters")
    values = message[keys]
    if not isinstance(values, list) or not all(
        isinstance(v, item) and not isinstance(v, bool) for v in values
    ):
        raise BadEvent(f"message.{keys}: expected a list of {item.__name__}")
    return group, message


def send(group: str, message: dict[str, Any], data_dir: Path | str | None = None) -> bool:
    """Hand one event to the web process listening on ``data_dir``; True if one took it."""
    return _send(encode(group, message), data_dir)


def hand_over(group: str, message: dict[str, Any]) -> None:
    """Hand an event to the web process on this data folder, unless this process is it
    (``llmgw_core.events`` calls this when no console listens on this process)."""
    if not listening():
        send(group, message)


def send_wake(data_dir: Path | str | None = None) -> bool:
    """Wake the reconciler's loop in the web process listening on ``data_dir``."""
    return _send(WAKE, data_dir)


def _send(data: bytes, data_dir: Path | str | None) -> bool:
    if not hasattr(socket, "AF_UNIX"):
        return False
    target = path(data_dir)
    if len(os.fsencode(target)) > MAX_PATH:
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        try:
            sock.sendto(data, os.fsencode(target))
        except (FileNotFoundError, ConnectionRefusedError):
            return False  # no web process on this data folder
    return True


def listening() -> bool:
    """Whether this process is the one the others send to."""
    return _listening is not None


def listen(data_dir: Path | str | None = None) -> Path | None:
    """Bind ``live.sock`` and hand what arrives to this process's channel layer.

    Returns the socket's path, or None when it cannot be bound here (no Unix sockets, or a
    data folder whose path is too long for one), which is logged: changes made by other
    processes then reach consoles when they reconnect.
    """
    global _listening
    target = path(data_dir)
    if not hasattr(socket, "AF_UNIX") or len(os.fsencode(target)) > MAX_PATH:
        log.warning(
            "changes made by other processes will show in consoles only when they reconnect: "
            "no Unix socket can be made at %s (set LLMGW_DATA_DIR to a shorter path)",
            target,
        )
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    with contextlib.suppress(FileNotFoundError):
        target.unlink()  # left by a web process that did not stop cleanly
    umask = os.umask(0o077)
    try:
        sock.bind(os.fsencode(target))
    finally:
        os.umask(umask)
    _listening = (target, target.stat().st_ino)
    atexit.register(_unlink)
    threading.Thread(target=_receive, args=(sock,), name="live-relay", daemon=True).start()
    return target


def _receive(sock: socket.socket) -> None:
    while True:
        data = sock.recv(MAX_DATAGRAM)
        try:
            if data == WAKE:
                woken = on_wake
                if woken is None:
                    raise RuntimeError("the cluster app is not ready: no wake is set")
                woken()
            else:
                events.send(*parse(data))
        except BadEvent as e:
            log.warning("dropped a live event from another process: %s", e)
        except Exception:
            log.exception("a live event from another process failed; listening on")


def _unlink() -> None:
    """Remove this process's socket, unless another web process has bound it since."""
    if _listening is None:
        return
    target, inode = _listening
    with contextlib.suppress(FileNotFoundError):
        if target.stat().st_ino == inode:
            target.unlink()
