"""Fixtures of the cluster's tests: what the capacity bench runs against.

``sims``: start a sim engine with a capacity (model, replica id, batch size), a real
``python -m agent.sim`` process holding its replica's engine key; its ``stats()`` are
the engine's own counts. ``gateway``: a real ``manage.py gateway serve`` process on the
test database, which the bench drives the replica through (its URL set as
``LLMGW_GATEWAY_URL``); it reads committed rows only, so a test using it is
transactional.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings as django_settings

from cluster import enginekeys
from tests.dburl import database_url
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
SERVING = re.compile(r"gateway serving on (http://127\.0\.0\.1:\d+)/v1/")


@dataclass
class Sim:
    proc: subprocess.Popen[str]
    url: str
    replica: int

    def stats(self) -> dict[str, int]:
        """The engine's own counts (``/sim/stats``: completed, cancelled, …)."""
        headers = {"Authorization": f"Bearer {enginekeys.engine_key(self.replica)}"}
        return httpx.get(self.url + "/sim/stats", headers=headers, timeout=10).json()


@pytest.fixture
def sims() -> Iterator[Any]:
    started: list[Sim] = []

    def start(model: str, replica: int, parallel: int) -> Sim:
        env = {**os.environ, "LLMGW_SIM_API_KEY": enginekeys.engine_key(replica)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", "0",
             "--model", model, "--parallel", str(parallel), "--ttft", "0.1", "--tps", "50"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True, env=env,
        )  # fmt: skip
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"listening on (http://\S+)", line)
        assert found, line
        sim = Sim(proc, found.group(1), replica)
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.proc.send_signal(signal.SIGTERM)
        sim.proc.wait(timeout=10)


@dataclass
class GatewayProcess:
    proc: subprocess.Popen[bytes]
    log: Path
    url: str = ""

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def gateway(transactional_db: Any, settings: Any, tmp_path: Path) -> Iterator[GatewayProcess]:
    """``manage.py gateway serve --port 0`` on the test database, embedded (no Redis);
    ``LLMGW_GATEWAY_URL`` points at it for the bench run in this process."""
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=database_url(),
        LLMGW_DATA_DIR=str(tmp_path / "gateway-data"),
        LLMGW_SECRET_KEY=str(django_settings.SECRET_KEY),
        LLMGW_LOCAL_AGENT="false",
    )
    env.pop("LLMGW_REDIS_URL", None)
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log = tmp_path / "gateway.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "gateway", "serve", "--port", "0"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    gw = GatewayProcess(proc, log)

    def serving() -> bool:
        assert proc.poll() is None, f"the gateway ended: {gw.output()[-3000:]}"
        found = SERVING.search(gw.output())
        if found:
            gw.url = found.group(1)
        return bool(found)

    try:
        wait_until(serving, timeout=60, what="the gateway process to serve")
        settings.LLMGW_GATEWAY_URL = gw.url
        yield gw
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
