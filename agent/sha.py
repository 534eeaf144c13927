"""A sha256 hashed on a thread of its own, so receiving a file and hashing it overlap.

A weights download hashes every byte as it arrives (one pass over them). Hashed on the
receiving thread, each chunk waits for its hash before the next is read; ``hashlib``
releases the GIL while it hashes a buffer of more than 2 KB, so on a second thread the two
run at once (bench/mirror.py: about 1.7 times the inline rate here, docs/updates.md). The
chunks are ``bytes`` (immutable: handed over, never copied); at most ``QUEUED`` wait, so a
hash that falls behind slows the reader rather than holding the file in memory.

No Django here: the agent and the control plane's mirror (updates.mirror) use it.
"""

from __future__ import annotations

import hashlib
import queue
import threading

# Chunks waiting to be hashed at most (httpx hands over 64 KB ones: 4 MB).
QUEUED = 64


class BackgroundSha256:
    """``update`` hands a chunk to the hashing thread; ``hexdigest`` waits for it to end
    and answers; ``close`` ends it without an answer (call it on every way out)."""

    def __init__(self) -> None:
        self._start()

    def _start(self) -> None:
        self._digest = hashlib.sha256()
        self._chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=QUEUED)
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """Start again from nothing (a server that ignored a Range sends the whole file)."""
        self.close()
        self._start()

    def _run(self) -> None:
        while (chunk := self._chunks.get()) is not None:
            self._digest.update(chunk)

    def update(self, chunk: bytes) -> None:
        """Hash ``chunk`` after the ones before it (waits while ``QUEUED`` wait)."""
        if not self._thread.is_alive():
            raise RuntimeError("this sha256 is closed")
        self._chunks.put(bytes(chunk))

    def close(self) -> None:
        """End the hashing thread once it has hashed what it was given."""
        if self._thread.is_alive():
            self._chunks.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        """Return the sha256 of every chunk given, in order (the thread ends)."""
        self.close()
        return self._digest.hexdigest()
