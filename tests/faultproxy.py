"""A TCP proxy a test puts between llmgw and what it leans on (PostgreSQL, Redis, a judge,
an engine), and cuts.

    proxy = FaultProxy(("127.0.0.1", 5432)).start()
    url = f"postgres://root@127.0.0.1:{proxy.port}/test"
    proxy.refuse()   # new connections are closed at once, open ones are cut (a server away)
    proxy.hang()     # new connections are accepted and never answered, open ones stall
    proxy.slow(0.4)  # every answer is held 0.4 s before it goes on (a loaded machine)
    proxy.heal()     # traffic passes again
    proxy.stop()

It runs in a thread of the test process with blocking sockets, one thread per direction of
each connection, so it needs no event loop of the test's. ``passed`` counts the connections
it let through; ``held`` is how many it is holding while hung.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

PASS, REFUSE, HANG = "pass", "refuse", "hang"


class FaultProxy:
    def __init__(self, target: tuple[str, int], host: str = "127.0.0.1", port: int = 0) -> None:
        self.target = target
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.2)
        self.host = host
        self.port = int(self._listener.getsockname()[1])
        self.mode = PASS
        self.passed = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._hung: set[socket.socket] = set()
        # The target's side of each connection, and how long its answers are held.
        self._upstreams: set[socket.socket] = set()
        self.delay = 0.0
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="fault-proxy", daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._hung)

    def start(self) -> FaultProxy:
        self._thread.start()
        return self

    def refuse(self) -> None:
        """Away: every open connection is cut and every new one closed at once."""
        self.mode = REFUSE
        self._cut(self._open)
        self._cut(self._hung)

    def hang(self) -> None:
        """Hung: open connections stop moving bytes; new ones are accepted and left waiting."""
        self.mode = HANG

    def slow(self, seconds: float) -> None:
        """Slow: every chunk the target answers is held ``seconds`` before it is passed on."""
        self.delay = seconds

    def heal(self) -> None:
        """Back: hung connections are cut (their peers see the reset), new ones pass."""
        self.mode = PASS
        self.delay = 0.0
        self._cut(self._hung)

    def stop(self) -> None:
        self._stopped.set()
        self._cut(self._open)
        self._cut(self._hung)
        with contextlib.suppress(OSError):
            self._listener.close()
        self._thread.join(timeout=5)

    def _cut(self, which: set[socket.socket]) -> None:
        with self._lock:
            socks = list(which)
            which.clear()
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if self.mode == REFUSE or self._stopped.is_set():
                with contextlib.suppress(OSError):
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
                    client.close()
                continue
            if self.mode == HANG:
                with self._lock:
                    self._hung.add(client)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._stopped.is_set() or self.mode == REFUSE:
                    # Stopped or cut while connecting: this one must not outlive it.
                    for s in (client, upstream):
                        with contextlib.suppress(OSError):
                            s.close()
                    continue
                self._open.update((client, upstream))
                self._upstreams.add(upstream)
                self.passed += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                while self.mode == HANG and not self._stopped.is_set():
                    # Hold the bytes; the connection looks alive and answers nothing.
                    with self._lock:
                        if src not in self._open:
                            return
                        self._hung.update((src, dst))
                    self._stopped.wait(0.05)
                if self.mode == REFUSE:
                    break
                if self.delay and src in self._upstreams:
                    # Held as a slow network holds it: what arrives meanwhile (the rest of
                    # the answer, pipelined answers) goes on with it, not a delay later.
                    self._stopped.wait(self.delay)
                    data += _available(src)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._open.discard(src)
                self._open.discard(dst)
                self._upstreams.discard(src)
                self._upstreams.discard(dst)
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


def _available(sock: socket.socket) -> bytes:
    """Return what a socket has to read now, without waiting for more."""
    chunks = []
    sock.setblocking(False)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    except (BlockingIOError, InterruptedError):
        pass
    finally:
        sock.setblocking(True)
    return b"".join(chunks)


@contextlib.contextmanager
def fault_proxy(target: tuple[str, int]) -> Iterator[FaultProxy]:
    proxy = FaultProxy(target).start()
    try:
        yield proxy
    finally:
        proxy.stop()
