"""``manage.py gateway serve --workers 2`` as an operator meets it: a real process on the
test database with a sim engine behind it, the official ``openai`` client in front.

Both workers answer (each reports its own load for scaling, under its own pid, as the
reconciler reads it); a worker killed with ``kill -9`` is started again by the parent,
which says so, and clients keep getting answers meanwhile; SIGTERM to the parent while a
stream is running lets that stream end whole, then every process exits.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis import Redis

from cluster import load
from cluster.models import Replica
from gateway import services as keys
from guard import services as guard_services
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import ROOT, ControlPlane, free_port, wait_for
from tests.guard.test_client import launch, stop
from tests.redisserver import url as redis_url

# 3 tests in about 60 s on a loaded 2-core machine.
pytestmark = [pytest.mark.e2e, pytest.mark.takes(3)]

STARTED = re.compile(
    r"^gateway serving on (http://127\.0\.0\.1:\d+/v1/) \(pid (\d+); 2 workers: (\d+), (\d+)\)$",
    re.M,
)
WEB_STARTED = re.compile(
    r"^web process serving on (http://127\.0\.0\.1:\d+/) \(pid (\d+); 2 workers: (\d+), (\d+)\)$",
    re.M,
)
REDIS_DB = 10


class Workers:
    """``gateway serve --workers 2`` (or the web process's ``serve``) running, its output
    in files."""

    def __init__(self, tmp: Path, env: dict[str, str], web: bool = False) -> None:
        self.out, self.err = tmp / "gateway.out", tmp / "gateway.err"
        command = ["serve", "--port", str(free_port())] if web else ["gateway", "serve",
                                                                     "--port", "0"]  # fmt: skip
        self.started = WEB_STARTED if web else STARTED
        with self.out.open("wb") as o, self.err.open("wb") as e:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", *command, "--workers", "2"], cwd=ROOT, env=env,
                stdout=o, stderr=e,
            )  # fmt: skip
        line = wait_for(self._line, 90, "the start line naming both workers")
        self.url, self.pid = line.group(1), int(line.group(2))
        if web:
            self.url += "v1/"
        self.workers = [int(line.group(3)), int(line.group(4))]

    def _line(self) -> re.Match[str] | None:
        assert self.proc.poll() is None, f"the server ended: {self.output()}"
        return self.started.search(self.out.read_text())

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(params=["gateway"])
def served(
    transactional_db: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[tuple[Workers, str, Redis]]:
    """A model whose replica is a sim engine (20 tokens a second), a key, and
    ``gateway serve --workers 2`` (``web``: ``serve --workers 2``) with Redis (where each
    worker reports its load)."""
    engine, engine_url = launch("--model", "bench", "--ttft", "0", "--tps", "20")
    redis = Redis.from_url(redis_url(REDIS_DB), socket_timeout=5)
    redis.flushdb()
    running = None
    try:
        store(sim_model("bench", tp=None))
        Replica.objects.create(model_name="bench", state="ready", profile="sim",
                               endpoint=engine_url)  # fmt: skip
        guard_services.set_policy({"directions": []}, surface="cli")
        _, secret = keys.create_key("workers")
        env = {**ControlPlane(tmp_path).env(), "LLMGW_REDIS_URL": redis_url(REDIS_DB)}
        running = Workers(tmp_path, env, web=request.param == "web")
        yield running, secret, redis
    finally:
        if running is not None:
            running.stop()
        stop(engine)
        redis.flushdb()
        redis.close()


def ask(workers: Workers, secret: str) -> str:
    """One answer to a new client (a connection of its own: the kernel picks its worker)."""
    with openai.OpenAI(base_url=workers.url, api_key=secret, max_retries=0, timeout=30) as api:
        answer = api.chat.completions.create(
            model="bench", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    assert answer.choices[0].message.content
    return answer.choices[0].finish_reason


def served_by(redis: Redis, pid: int) -> int:
    """The answers the worker ``pid`` reports for the model over its last seconds (its load
    report for scaling, ``cluster.load``)."""
    raw = redis.get(f"{load.prefix()}{os.uname().nodename}:{pid}")
    if raw is None:
        return 0
    report = json.loads(raw)
    return sum(report["models"].get("bench", {}).get("ttft", []))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A child not yet reaped by its parent is a zombie: it serves nothing.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


def test_two_workers_share_the_port_and_both_answer(served: Any) -> None:
    workers, secret, redis = served
    assert len(set(workers.workers)) == 2 and workers.pid not in workers.workers
    for pid in workers.workers:  # the parent's own children
        assert Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1] == str(
            workers.pid
        )
    for _ in range(16):
        assert ask(workers, secret) == "length"
    for pid in workers.workers:
        wait_for(lambda p=pid: served_by(redis, p), 15, f"worker {pid}'s answers reported")
    out = workers.output()
    assert "gateway worker 1 serving (pid" in out and "gateway worker 2 serving (pid" in out


@pytest.mark.parametrize("served", ["gateway", "web"], indirect=True)
def test_a_worker_killed_is_started_again_and_clients_keep_their_answers(served: Any) -> None:
    """The gateway's workers, and the web process's (which serves /v1/ too)."""
    workers, secret, redis = served
    name = "web process" if "web process serving" in workers.output() else "gateway"
    first, second = workers.workers
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), 10, "the killed worker gone")
    # Meanwhile new clients reach the other worker: none is refused.
    for _ in range(6):
        assert ask(workers, secret) == "length"
    said = wait_for(
        lambda: re.search(name + r" worker 1 \(pid (\d+)\) died after [\d.]+ s: killed by "
                          r"signal 9 \(SIGKILL\); starting it again in ([\d.]+) s",
                          workers.output()),  # fmt: skip
        10, "the parent saying the worker died",
    )  # fmt: skip
    assert int(said.group(1)) == first
    again = wait_for(
        lambda: [
            int(p)
            for p in re.findall(name + r" worker 1 serving \(pid (\d+)\)", workers.output())
            if int(p) != first
        ],  # fmt: skip
        30,
        "worker 1 started again",
    )[0]
    assert again not in (first, second) and alive(again) and alive(second)
    # The new worker serves too.
    wait_for(lambda: ask(workers, secret) and served_by(redis, again), 30,
             "the new worker's answers reported")  # fmt: skip
    assert workers.proc.poll() is None


def test_sigterm_lets_a_running_stream_end_whole_then_every_process_exits(
    served: Any,
) -> None:
    workers, secret, _ = served
    tokens = 40  # two seconds at the engine's 20 a second
    with httpx.Client(timeout=30) as http, http.stream(
        "POST", workers.url + "chat/completions", headers={"Authorization": f"Bearer {secret}"},
        json={"model": "bench", "stream": True, "max_tokens": tokens,
              "messages": [{"role": "user", "content": "write at length"}]},
    ) as resp:  # fmt: skip
        assert resp.status_code == 200
        lines = resp.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["object"] == "chat.completion.chunk"
        workers.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "SIGTERM: stopping the workers" in workers.output(), 10,
                 "the parent saying it stops")  # fmt: skip
        rest = [line[6:] for line in lines if line.startswith("data: ")]
    assert rest[-1] == "[DONE]"
    chunks = [json.loads(first[6:])] + [json.loads(r) for r in rest[:-1]]
    assert [c for c in chunks if c["choices"]][-1]["choices"][0]["finish_reason"] == "length"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text
    assert workers.proc.wait(timeout=60) == 0
    for pid in workers.workers:
        assert not alive(pid), f"worker {pid} outlived its parent"
    assert "gateway: every worker stopped" in workers.output()
    with pytest.raises(httpx.ConnectError):
        httpx.get(workers.url + "models", timeout=5)


def test_the_embedded_web_process_refuses_workers(transactional_db: Any, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "serve", "--port", str(free_port()), "--workers", "2"],
        cwd=ROOT, env=ControlPlane(tmp_path).env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "--workers 2: the embedded web process (no LLMGW_REDIS_URL) is one process" in (
        done.stderr
    )
    assert "Set LLMGW_REDIS_URL" in done.stderr and "reconciling" not in done.stdout
