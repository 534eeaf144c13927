"""A redis-server of this test run's own (or of one test's own), on a port of its own.

Every test run starts one (``tests/settings.py``, before anything reads Redis) and puts its
address in ``LLMGW_TEST_REDIS_URL``; every test that needs Redis takes it from :func:`url`.
Two runs on one machine (two engineers, a run beside a benchmark, pytest-xdist's workers)
then never share a channel layer, a Celery queue or a budget key: a worker of one run
never takes a task of another's, and flushing a database harms no one else. A test that
stops Redis on purpose starts a :class:`RedisServer` of its own.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ENV = "LLMGW_TEST_REDIS_URL"
# Which process started the run's server: pytest-xdist's workers each start their own, and a
# process a test starts (which inherits the variables) starts none.
OWNER_ENV = "LLMGW_TEST_REDIS_FOR"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RedisServer:
    """A redis-server on a free port that keeps nothing on disk; stopping it harms no one."""

    tmp: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, within: float = 20.0) -> None:
        if shutil.which("redis-server") is None:
            raise RuntimeError("redis-server is missing: apt-get install -y redis-server")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.tmp)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + within
        while not self._pong():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not answer")
            time.sleep(0.05)

    def _pong(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_for_run() -> None:
    """Start this process's server unless it (or the process that started this one) has."""
    owner = os.environ.get("PYTEST_XDIST_WORKER", "main")
    if os.environ.get(ENV) and os.environ.get(OWNER_ENV, owner) == owner:
        return  # given by the person running the tests, or already started
    server = RedisServer(Path(tempfile.mkdtemp(prefix="llmgw-test-redis-")))
    server.start()
    atexit.register(server.stop)
    os.environ[ENV] = server.url.rsplit("/", 1)[0] + "/15"
    os.environ[OWNER_ENV] = owner


def url(db: int = 15) -> str:
    """The run's Redis, at database ``db`` (each test module keeps to its own number)."""
    base = os.environ.get(ENV) or "redis://127.0.0.1:6379/15"
    parts = urlsplit(base)
    return urlunsplit(parts._replace(path=f"/{db}"))
