"""``manage.py gateway serve`` as an operator meets it: the real command in a process of
its own, on the test database, with no web process beside it.

What it refuses before anything starts, the line that says where it listens (the port a
``--port 0`` got), the warning that budgets are counted per process without Redis, and
``GET /healthz`` for the load balancer in front of several processes.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.conftest import ROOT, ControlPlane, wait_for
from tests.redisserver import url as redis_url

# 14 tests in 116 s on a loaded 2-core machine (the database's setup included).
pytestmark = [pytest.mark.e2e, pytest.mark.takes(8)]

SERVING = re.compile(r"^gateway serving on (http://127\.0\.0\.1:(\d+)/v1/) \(pid (\d+)\)$", re.M)


def env(tmp: Path, **extra: str) -> dict[str, str]:
    """The process's variables: the test database, a data folder of its own, no Redis."""
    return {**ControlPlane(tmp).env(), **extra}


def serve(tmp: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    """Run ``gateway serve`` expecting it to stop by itself (a refusal)."""
    return subprocess.run(
        [sys.executable, "manage.py", "gateway", "serve", *args], cwd=ROOT,
        env=env(tmp, **extra), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@dataclass
class Running:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def output(self) -> tuple[str, str]:
        return self.out.read_text(), self.err.read_text()


@contextmanager
def serving(tmp: Path, *args: str, **extra: str) -> Iterator[Running]:
    """``gateway serve`` running, its output in files (as under systemd or a log file)."""
    out, err = tmp / "gateway.out", tmp / "gateway.err"
    with out.open("wb") as o, err.open("wb") as e:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "gateway", "serve", *args], cwd=ROOT,
            env=env(tmp, **extra), stdout=o, stderr=e,
        )  # fmt: skip
    try:
        yield Running(proc, out, err)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def started(running: Running) -> re.Match[str]:
    """The start line, once it is printed (failing at once if the process ended)."""

    def line() -> re.Match[str] | None:
        assert running.proc.poll() is None, f"the gateway process ended: {running.output()}"
        return SERVING.search(running.output()[0])

    found: re.Match[str] = wait_for(line, 60, "the gateway process's start line")
    return found


@pytest.mark.parametrize("port", ["99999", "65536", "-1"])
def test_a_port_out_of_range_is_refused_before_anything_starts(
    transactional_db: Any, tmp_path: Path, port: str
) -> None:
    # It was taken modulo 65536: --port 99999 listened on 34463 and said nothing.
    done = serve(tmp_path, "--port", port)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"--port {port}: a port is 0 to 65535" in done.stderr
    assert "0 for any free port" in done.stderr
    assert "gateway serving" not in done.stdout
    # Nothing started: not even the metrics' files of the data folder.
    assert not (tmp_path / "data" / "metrics").exists()


@pytest.mark.parametrize(
    ("bind", "says"),
    [
        ("999.1.1.1", "is not an IP address or a host name"),
        ("http://0.0.0.0", "is not an IP address or a host name"),
        ("", "is not an IP address or a host name"),
        ("no-such-host.invalid", "no such host"),
        ("192.0.2.1", "is not an address of this machine"),  # TEST-NET-1: no machine's
    ],
)
def test_a_bad_bind_is_refused_saying_what_to_write(
    transactional_db: Any, tmp_path: Path, bind: str, says: str
) -> None:
    done = serve(tmp_path, "--bind", bind, "--port", "0")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert says in done.stderr
    assert "write an address of this machine: 127.0.0.1 (this machine only), 0.0.0.0" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "metrics").exists()


def test_a_negative_worker_count_is_refused(transactional_db: Any, tmp_path: Path) -> None:
    done = serve(tmp_path, "--port", "0", "--workers", "-1")
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "--workers -1: 1 or more, or 0 for one a core" in done.stderr
    assert "gateway serving" not in done.stdout


def test_a_port_in_use_is_refused_naming_it(transactional_db: Any, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = serve(tmp_path, "--port", str(port))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"--port {port}: the port is in use" in done.stderr
    assert "--port 0 for any free one" in done.stderr


def test_port_0_prints_the_port_it_got_and_warns_budgets_are_per_process(
    transactional_db: Any, tmp_path: Path
) -> None:
    with serving(tmp_path, "--port", "0") as running:
        line = started(running)
        url, port, pid = line.group(1), int(line.group(2)), int(line.group(3))
        assert port != 0 and pid == running.proc.pid
        # The printed address is the one serving: an unknown key is refused there.
        api = openai.OpenAI(base_url=url, api_key="llmgw-ck-nonesuch", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            api.models.list()
        out, err = running.output()
        assert out.count("gateway serving on") == 1
        assert (
            "warning: LLMGW_REDIS_URL is unset, so keys' budgets (--rpm, --tpm) are counted by "
            "each gateway process on its own" in err
        )
        assert "Set LLMGW_REDIS_URL to share them." in err


def test_with_redis_no_warning_about_budgets(transactional_db: Any, tmp_path: Path) -> None:
    with serving(tmp_path, "--port", "0", LLMGW_REDIS_URL=redis_url(13)) as running:
        started(running)
        assert "LLMGW_REDIS_URL" not in running.output()[1]


def test_its_load_is_reported_from_the_start_before_any_request(
    transactional_db: Any, tmp_path: Path
) -> None:
    """The traffic's thread starts when it listens, not at its first answer: a process that
    has answered nothing yet (its requests waiting on a cold replica) reports its load."""
    import json
    import socket as sockets

    from redis import Redis

    from cluster import load

    url = redis_url(11)
    client = Redis.from_url(url, socket_timeout=5)
    client.flushdb()
    try:
        with serving(tmp_path, "--port", "0", LLMGW_REDIS_URL=url) as running:
            pid = started(running).group(3)
            key = f"{load.prefix()}{sockets.gethostname()}:{pid}"
            raw = wait_for(lambda: client.get(key), 30, "the process's first load report")
            report = json.loads(raw)
            assert report["process"].endswith(f":{pid}") and report["models"] == {}
            assert client.sismember(load.prefix() + "processes", report["process"])
    finally:
        client.flushdb()
        client.close()


def test_healthz_answers_ok_with_no_credential_once_the_table_is_read(
    transactional_db: Any, tmp_path: Path
) -> None:
    with serving(tmp_path, "--port", "0") as running:
        base = started(running).group(1).removesuffix("/v1/")

        def ok() -> httpx.Response | None:
            r = httpx.get(base + "/healthz", timeout=5)
            assert r.status_code in (200, 503), r.text
            return r if r.status_code == 200 else None

        # Ready with no /v1/ request before: the table's reader started when it listened.
        r = wait_for(ok, 30, "/healthz to answer 200")
        assert r.content == b'{"status":"ok"}'
        assert r.headers["content-type"] == "application/json"
        assert r.headers["cache-control"] == "no-store"
        head = httpx.head(base + "/healthz", timeout=5)
        assert head.status_code == 200 and head.content == b""
        post = httpx.post(base + "/healthz", timeout=5)
        assert post.status_code == 405 and post.headers["allow"] == "GET, HEAD"
        # It is no part of the OpenAI API, and nothing under /v1/ is open.
        assert httpx.get(base + "/v1/healthz", timeout=5).status_code == 401


def test_healthz_is_503_while_the_table_cannot_be_read(
    transactional_db: Any, tmp_path: Path
) -> None:
    # A database nobody listens on: the process serves, but cannot route yet.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    down = {"LLMGW_DATABASE_URL": f"postgres://llmgw@127.0.0.1:{dead}/llmgw"}
    with serving(tmp_path, "--port", "0", **down) as running:
        base = started(running).group(1).removesuffix("/v1/")
        wait_for(lambda: "could not read the catalog" in running.output()[1], 30,
                 "a failed read of the table")  # fmt: skip
        r = httpx.get(base + "/healthz", timeout=5)
        assert r.status_code == 503
        assert r.content == b'{"status":"starting"}'
