"""The agent's state folder: its node token and the engines it runs. No Django here.

Each file is written atomically (a temporary file beside it, flushed, then renamed over
it), so an agent killed mid-write leaves the old file or the new one, never half of one.
A restarted agent reads ``engines.json`` to find the engines it started before (see
agent.supervisor), which is how it never starts one twice.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

TOKEN_FILE = "node_token"
ENGINES_FILE = "engines.json"
LOG_DIR = "logs"


def write_atomic(path: str | os.PathLike[str], data: str, mode: int = 0o644) -> None:
    """Replace a file's contents in one step, with these permissions from the start."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def load_token(state_dir: str | os.PathLike[str]) -> str | None:
    """Return the node token saved by an earlier join, or None."""
    try:
        token = (Path(state_dir) / TOKEN_FILE).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return token or None


def save_token(state_dir: str | os.PathLike[str], token: str) -> None:
    """Save the node token, readable by this user only: it speaks for the node."""
    write_atomic(Path(state_dir) / TOKEN_FILE, token + "\n", mode=0o600)


def load_engines(state_dir: str | os.PathLike[str]) -> dict[int, dict[str, Any]]:
    """Return the engines recorded as running, by replica id.

    A file that cannot be read is taken as empty: the agent then starts what the
    control plane asks for, and finds nothing to adopt, rather than not starting.
    """
    try:
        raw = json.loads((Path(state_dir) / ENGINES_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}
    engines = raw.get("engines", {}) if isinstance(raw, dict) else {}
    return {int(k): v for k, v in engines.items() if isinstance(v, dict)}


def save_engines(state_dir: str | os.PathLike[str], engines: dict[int, dict[str, Any]]) -> None:
    """Record the engines running now, replacing the previous record.

    Readable by this user only: it holds each engine's key (and SGLang's command line).
    """
    payload = {"engines": {str(k): v for k, v in sorted(engines.items())}}
    write_atomic(
        Path(state_dir) / ENGINES_FILE,
        json.dumps(payload, indent=1, sort_keys=True),
        mode=0o600,
    )


def log_path(state_dir: str | os.PathLike[str], replica_id: int) -> Path:
    """Return the file a replica's engine writes its output to."""
    return Path(state_dir) / LOG_DIR / f"replica-{replica_id}.log"
