"""An engine's log file: its last line (why it stopped) and its last lines, secrets masked.

The engine's log a report carries (docs/agent-protocol.md): its last lines, each cut to a
length, read from at most the file's last bytes.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

LOG_LINES = 40
LOG_LINE_CHARS = 300
LOG_READ_BYTES = 16384
# What a log line or a reason shows in place of an engine key.
KEY_SHOWN = "[engine key]"
# Any llmgw secret (an engine key, a node or join token) an engine might print.
_SECRET = re.compile(r"llmgw_(?:engine|node|join)_[A-Za-z0-9_\-]+")
SECRET_SHOWN = "[secret]"


def redact(text: str, keys: set[str]) -> str:
    """Return ``text`` without these engine keys (an engine's output may hold one: SGLang
    prints its arguments)."""
    for key in keys:
        if key:
            text = text.replace(key, KEY_SHOWN)
    return text


def mask_secrets(line: str) -> str:
    """Return a line with any llmgw token in it masked."""
    return _SECRET.sub(SECRET_SHOWN, line)


def last_line(path: Path, limit: int = 300) -> str:
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


def tail(path: Path) -> list[str]:
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
