"""Measure heartbeats: 200 simulated agents heartbeating every 5 s against one web process.

    .venv/bin/python bench/agents.py [--agents 200] [--interval 5] [--seconds 60]

Starts `manage.py serve` (Daphne, one process, the reconciler in-process) on a throwaway
PostgreSQL database, joins the agents through the real API, then has each heartbeat on its
own schedule (spread over the interval, as real agents drift). Prints heartbeat latency
p50/p99 and the web process's CPU use; asserts nothing. Goal (issue 3): p99 under 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

import httpx  # noqa: E402

logging.getLogger("httpx").setLevel(logging.WARNING)
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def inventory(i: int) -> dict[str, Any]:
    return {
        "hostname": f"sim-{i:03d}", "agent_version": "bench", "cpu_cores": 64,
        "memory_mb": 512_000, "disk_free_mb": 2_000_000,
        "labels": {"llmgw.io/rack": f"r{i // 20}"}, "engines": {"sim": "1"},
        "cards": [{"index": k, "class": "nvidia-h100-80gb", "memory_mb": 81559, "power_limit_w": 700}
                  for k in range(2)],
        "weights": [], "simulated": True,
    }  # fmt: skip


async def run_agents(
    base: str, secret: str, n: int, interval: float, seconds: float
) -> list[float]:
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=base, timeout=30, limits=limits) as client:
        tokens = []
        for i in range(n):
            r = await client.post(
                "/api/v1/agent/join",
                json={"token": secret, "name": f"sim-{i:03d}", "inventory": inventory(i)},
            )
            r.raise_for_status()
            tokens.append(r.json()["node_token"])
        stop = time.monotonic() + seconds

        async def agent(i: int, token: str) -> None:
            await asyncio.sleep(random.uniform(0, interval))
            headers = {"Authorization": f"Bearer {token}"}
            version = None
            while time.monotonic() < stop:
                t = time.perf_counter()
                r = await client.post(
                    "/api/v1/agent/heartbeat", json={"inventory": inventory(i)}, headers=headers
                )
                latencies.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()
                if r.json()["desired_version"] != version:
                    version = r.json()["desired_version"]
                    await client.get("/api/v1/agent/desired", headers=headers)
                await asyncio.sleep(interval)

        await asyncio.gather(*(agent(i, t) for i, t in enumerate(tokens)))
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--reconciler",
        choices=("worker", "in-process"),
        default="worker",
        help="worker: as in production, the web process only serves (the reconciler runs in "
        "a Celery worker, not started here); in-process: the embedded mode's loop",
    )
    args = parser.parse_args()

    setup_test_environment()
    # A database of its own, so a benchmark never touches a test run's test_llmgw.
    connection.settings_dict.setdefault("TEST", {})["NAME"] = "llmgw_bench_agents"
    old_name = connection.settings_dict["NAME"]
    db_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    from cluster.models import JoinToken

    _, secret = JoinToken.issue("bench")
    connection.close()
    db = connection.settings_dict
    port = free_port()
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db_name}",
        LLMGW_SECRET_KEY="bench", LLMGW_DATA_DIR=f"/tmp/llmgw-bench-{port}",
        LLMGW_NODE_LOST_AFTER="60",
        LLMGW_LOCAL_AGENT="false",
    )  # fmt: skip
    env.pop("LLMGW_REDIS_URL", None)
    if args.reconciler == "worker":
        # Production's layout: with Redis configured the web process does not reconcile.
        env["LLMGW_REDIS_URL"] = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    web_log = Path(f"/tmp/llmgw-bench-web-{port}.log").open("w")  # noqa: SIM115
    web = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=web_log,
    )
    print(f"web process log: {web_log.name}")
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                httpx.get(base + "/login/", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.2)
        cpu0, t0, me0 = cpu_seconds(web.pid), time.monotonic(), time.process_time()
        lat = asyncio.run(run_agents(base, secret, args.agents, args.interval, args.seconds))
        client_cpu = (time.process_time() - me0) / (time.monotonic() - t0)
        cpu = (cpu_seconds(web.pid) - cpu0) / (time.monotonic() - t0)
    finally:
        web.terminate()
        try:
            web.wait(timeout=20)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait()
        connection.creation.destroy_test_db(old_name, verbosity=0)
    lat.sort()
    p50 = statistics.median(lat)
    p99 = lat[int(len(lat) * 0.99) - 1]
    print(
        f"{len(lat)} heartbeats from {args.agents} agents every {args.interval:g} s over {args.seconds:g} s"
    )
    print(f"  p50 {p50:.1f} ms, p99 {p99:.1f} ms, max {lat[-1]:.1f} ms")
    print(f"  reconciler: {args.reconciler}")
    print(
        f"  web process CPU: {cpu * 100:.0f}% of one core; the agents' client (this process, same machine): {client_cpu * 100:.0f}%"
    )
    print(f"heartbeat p99 with {args.agents} agents: {p99:.1f} ms")


if __name__ == "__main__":
    main()
