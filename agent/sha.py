"""A sha256 hashed on a thread of its own, so receiving a file and hashing it overlap.

A weights download hashes every byte as it arrives (one pass over them). Hashed on the
receiving thread, each chunk waits for its hash before the next is read; ``hashlib``
releases the GIL while it hashes a buffer of more than 2 KB, so on a second thread the two
run at once (bench/mirror.py, docs/updates.md).

``fill`` is the receiving side's way in (agent.transfer): it reads the next bytes straight
into one of a few large buffers of its own (``BUFFERS`` of ``BUFFER`` bytes, taken again
once hashed), hands them to the thread, and gives the caller a view of them to write to
the file meanwhile: no copy of a byte in Python, and one hash call a buffer. The buffers
are anonymous maps, so they start on a page: a file opened with ``O_DIRECT`` is written
from them as they are (agent.transfer). ``update``
takes ``bytes`` (immutable: handed over, never copied); at most ``QUEUED`` wait. Either
way a hash that falls behind slows the reader rather than holding the file in memory.

No Django here: the agent and the control plane's mirror (updates.mirror) use it.
"""

from __future__ import annotations

import hashlib
import mmap
import queue
import threading
from collections.abc import Callable

# Chunks given to ``update`` waiting to be hashed, at most.
QUEUED = 64
# ``fill``'s buffers: how many, and their size (32 MB in all a download). 4 MB cost the
# least CPU a GB written with O_DIRECT of 1, 2, 4 and 8 MB (bench/mirror.py).
BUFFERS = 8
BUFFER = 4 << 20


class BackgroundSha256:
    """``update`` or ``fill`` hands bytes to the hashing thread; ``hexdigest`` waits for it
    to end and answers; ``close`` ends it without an answer (call it on every way out)."""

    def __init__(self, *, buffers: int | None = None, size: int | None = None) -> None:
        self._size = size or BUFFER
        self._buffers = max(1, buffers or BUFFERS)
        self._made = 0
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        # Buffers kept by the caller too (``fill(keep=True)``): how many holders are left.
        self._holds: dict[int, int] = {}
        self._holds_lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        self._digest = hashlib.sha256()
        self._chunks: queue.Queue[tuple[bytes | mmap.mmap, int] | None] = queue.Queue(
            maxsize=max(QUEUED, self._buffers)
        )
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """Start again from nothing (a server that ignored a Range sends the whole file)."""
        self.close()
        self._start()

    def _run(self) -> None:
        while (item := self._chunks.get()) is not None:
            data, n = item
            if isinstance(data, mmap.mmap):
                self._digest.update(memoryview(data)[:n])
                self._put_back(data)  # hashed: filled again once its holders are done
            else:
                self._digest.update(data)

    def _alive(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("this sha256 is closed")

    def update(self, chunk: bytes) -> None:
        """Hash ``chunk`` after the ones before it (waits while ``QUEUED`` wait)."""
        self._alive()
        data = bytes(chunk)
        self._chunks.put((data, len(data)))

    def fill(self, read_into: Callable[[memoryview], int], *, keep: bool = False) -> memoryview:
        """Read the next bytes with ``read_into`` (it fills the view it is given and says
        how many bytes it put there, 0 at the end), have them hashed after the ones before,
        and return a view of them (empty at the end).

        The view stays good until the next ``fill``: write it out before asking again.
        With ``keep`` it stays good until ``release(view)`` instead (a writer on a thread
        of its own): its buffer is filled again once hashed and released.
        An exception from ``read_into`` goes to the caller; nothing is hashed of that read.
        """
        self._alive()
        buffer = self._take()
        try:
            n = read_into(memoryview(buffer))
        except BaseException:
            self._free.put(buffer)
            raise
        if not n:
            self._free.put(buffer)
            return memoryview(b"")
        if keep:
            with self._holds_lock:
                self._holds[id(buffer)] = 2  # the hashing thread and the caller
        self._chunks.put((buffer, n))
        return memoryview(buffer)[:n]

    def release(self, view: memoryview) -> None:
        """The caller is done with a view ``fill(keep=True)`` gave."""
        self._put_back(view.obj)  # type: ignore[arg-type]

    def _put_back(self, buffer: mmap.mmap) -> None:
        with self._holds_lock:
            left = self._holds.pop(id(buffer), 1) - 1
            if left:
                self._holds[id(buffer)] = left
                return
        self._free.put(buffer)

    def _take(self) -> mmap.mmap:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._made < self._buffers:
            self._made += 1
            return mmap.mmap(-1, self._size)  # page-aligned (O_DIRECT writes from it)
        return self._free.get()  # every buffer is being hashed: wait for one

    def close(self) -> None:
        """End the hashing thread once it has hashed what it was given."""
        if self._thread.is_alive():
            self._chunks.put(None)
            self._thread.join()

    def hexdigest(self) -> str:
        """Return the sha256 of every chunk given, in order (the thread ends)."""
        self.close()
        return self._digest.hexdigest()
