"""The web process a benchmark measures: `manage.py serve` started, awaited and stopped."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def throwaway_database(name: str) -> tuple[str, str]:
    """Create a database of the benchmark's own (so it never touches a test run's).

    Returns the settings' database name, for :func:`drop_database`, and the new one's.
    """
    from django.db import connection
    from django.test.utils import setup_test_environment

    setup_test_environment()
    connection.settings_dict.setdefault("TEST", {})["NAME"] = name
    old = connection.settings_dict["NAME"]
    return old, connection.creation.create_test_db(verbosity=0, autoclobber=True)


def drop_database(old: str) -> None:
    """Drop the database :func:`throwaway_database` made."""
    from django.db import connection

    connection.close()
    connection.creation.destroy_test_db(old, verbosity=0)


def database_url(name: str) -> str:
    """``LLMGW_DATABASE_URL`` for the web process: this process's server, database ``name``."""
    from urllib.parse import quote

    from django.db import connection

    db = connection.settings_dict
    login = quote(db["USER"], safe="") + (
        ":" + quote(db["PASSWORD"], safe="") if db.get("PASSWORD") else ""
    )
    return f"postgres://{login}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(env: dict[str, str], port: int, name: str, workers: int = 1) -> subprocess.Popen[bytes]:
    """Start `manage.py serve --workers N` on ``port`` (its stderr to /tmp) and wait until
    every worker answers (``workers`` above 1 needs ``LLMGW_REDIS_URL`` in ``env``)."""
    log = Path(f"/tmp/llmgw-bench-{name}-web-{port}.log").open("w")  # noqa: SIM115
    web = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", str(workers)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    print(f"web process log: {log.name}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if web.poll() is not None:
            raise RuntimeError(f"the web process exited ({web.returncode}): see {log.name}")
        if len(children(web.pid)) >= (workers if workers > 1 else 0):
            try:
                httpx.get(f"http://127.0.0.1:{port}/login/", timeout=1)
                break
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    return web


def children(pid: int) -> list[int]:
    """The processes ``pid`` started (its workers, with ``--workers`` above 1)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(c) for c in text.split()]


def cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid`` and its workers have used (their own, not their children's)."""
    total = 0.0
    for p in (pid, *children(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def stop(web: subprocess.Popen[bytes]) -> None:
    """Stop the web process: SIGTERM, then SIGKILL after 20 s."""
    web.terminate()
    try:
        web.wait(timeout=20)
    except subprocess.TimeoutExpired:
        web.kill()
        web.wait()
