"""Files and batches on disk under ``LLMGW_FILES_DIR``: a folder every web and worker
process reaches (production: a shared volume, as the mirror is).

``files/<id>.json`` a file's object (and its owner), ``files/<id>.data`` its bytes;
``batches/<id>.json`` a batch, ``batches/<id>.journal`` its lines' results as they finish
(one JSON line each, written and flushed before the next line is counted), ``<id>.lock``
held by the runner running it (an OS lock: a process killed lets it go at once).
A batch's object is changed under its own lock (``update``), so the runner's counts and a
client's cancel never undo each other. Everything here blocks: the gateway calls it on a
thread of its own, bounded (``gateway.batch.routes``).
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from django.conf import settings


def root() -> Path:
    return Path(settings.LLMGW_FILES_DIR)


def _dir(kind: str) -> Path:
    path = root() / kind
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _safe(object_id: str, prefix: str) -> bool:
    rest = object_id[len(prefix) :]
    return object_id.startswith(prefix) and rest.isalnum() and 0 < len(rest) <= 64


def _write_json(path: Path, value: Any) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(value, ensure_ascii=False))
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


# -- files --------------------------------------------------------------------------------


def save_file(owner: str, filename: str, purpose: str, data: bytes) -> dict[str, Any]:
    file_id = "file-" + secrets.token_hex(12)
    folder = _dir("files")
    (folder / f"{file_id}.data").write_bytes(data)
    now = int(time.time())
    meta = {"id": file_id, "object": "file", "bytes": len(data), "created_at": now,
            "expires_at": now + settings.LLMGW_FILES_KEEP * 86400, "filename": filename,
            "purpose": purpose,
            "status": "processed", "status_details": None, "owner": owner}  # fmt: skip
    _write_json(folder / f"{file_id}.json", meta)
    return meta


def get_file(owner: str | None, file_id: str) -> dict[str, Any] | None:
    """A file's object (with its owner), None when not there for ``owner`` (None: any)."""
    if not _safe(file_id, "file-"):
        return None
    meta = _read_json(_dir("files") / f"{file_id}.json")
    if meta is None or (owner is not None and meta["owner"] != owner):
        return None
    return meta


def file_content(owner: str | None, file_id: str) -> bytes | None:
    if get_file(owner, file_id) is None:
        return None
    try:
        return (_dir("files") / f"{file_id}.data").read_bytes()
    except FileNotFoundError:
        return None


def delete_file(owner: str | None, file_id: str) -> bool:
    if get_file(owner, file_id) is None:
        return False
    folder = _dir("files")
    (folder / f"{file_id}.json").unlink(missing_ok=True)
    (folder / f"{file_id}.data").unlink(missing_ok=True)
    return True


def list_files(owner: str | None, purpose: str | None = None) -> list[dict[str, Any]]:
    """The owner's files, newest first."""
    out = []
    for path in _dir("files").glob("file-*.json"):
        meta = _read_json(path)
        if meta is None or (owner is not None and meta["owner"] != owner):
            continue
        if purpose is None or meta["purpose"] == purpose:
            out.append(meta)
    return sorted(out, key=lambda m: (m["created_at"], m["id"]), reverse=True)


def shown_file(meta: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in meta.items() if k != "owner"}


# -- batches ------------------------------------------------------------------------------


def new_batch_id() -> str:
    return "batch_" + secrets.token_hex(12)


def batch_path(batch_id: str, suffix: str) -> Path:
    return _dir("batches") / f"{batch_id}{suffix}"


@contextmanager
def _locked(path: Path, blocking: bool = True) -> Iterator[bool]:
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def running(batch_id: str) -> Any:
    """Hold the batch's runner lock (yields False when another process holds it)."""
    return _locked(batch_path(batch_id, ".lock"), blocking=False)


def save_batch(batch: dict[str, Any]) -> None:
    with _locked(batch_path(batch["id"], ".mlock")):
        _write_json(batch_path(batch["id"], ".json"), batch)


def get_batch(owner: str | None, batch_id: str) -> dict[str, Any] | None:
    if not _safe(batch_id, "batch_"):
        return None
    batch = _read_json(batch_path(batch_id, ".json"))
    if batch is None or (owner is not None and batch["owner"] != owner):
        return None
    return batch


def update(batch_id: str, change: Callable[[dict[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """Change a batch under its lock; the batch as it then is."""
    with _locked(batch_path(batch_id, ".mlock")):
        batch = _read_json(batch_path(batch_id, ".json"))
        changed = change(batch)
        if changed is not batch:
            _write_json(batch_path(batch_id, ".json"), changed)
        return changed


def list_batches(owner: str | None) -> list[dict[str, Any]]:
    out = []
    for path in _dir("batches").glob("batch_*.json"):
        batch = _read_json(path)
        if batch is not None and (owner is None or batch["owner"] == owner):
            out.append(batch)
    return sorted(out, key=lambda b: (b["created_at"], b["id"]), reverse=True)


# -- a batch's journal: its lines' results as they finish ----------------------------------


def journal(batch_id: str) -> dict[int, dict[str, Any]]:
    """The results written so far, by line number; a line torn by a process killed while
    writing it is cut off (that line runs again)."""
    path = batch_path(batch_id, ".journal")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    whole = raw.rfind(b"\n") + 1
    if whole < len(raw):
        with open(path, "r+b") as handle:
            handle.truncate(whole)
    done = {}
    for text in raw[:whole].splitlines():
        record = json.loads(text)
        done.setdefault(record["line"], record)
    return done


class Journal:
    """Appends a line's result and flushes it to disk before returning."""

    def __init__(self, batch_id: str) -> None:
        self.handle = open(batch_path(batch_id, ".journal"), "ab")  # noqa: SIM115 - closed by close()

    def write(self, record: dict[str, Any]) -> None:
        self.handle.write(json.dumps(record, ensure_ascii=False).encode() + b"\n")
        self.handle.flush()
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


# -- pruning -------------------------------------------------------------------------------


def prune(days: int, now: float | None = None) -> int:
    """Delete files older than ``days`` and ended batches whose files are gone with them;
    return how many files went."""
    cutoff = (now or time.time()) - days * 86400
    gone = 0
    for meta in list_files(None):
        if meta["created_at"] < cutoff and delete_file(None, meta["id"]):
            gone += 1
    for batch in list_batches(None):
        if batch["created_at"] < cutoff and batch["status"] in (
            "completed", "failed", "expired", "cancelled",
        ):  # fmt: skip
            for suffix in (".json", ".journal", ".lock", ".mlock"):
                batch_path(batch["id"], suffix).unlink(missing_ok=True)
    return gone
