"""Measure heartbeats: simulated agents heartbeating every 5 s against the web processes.

    .venv/bin/python bench/agents.py [--agents 200] [--workers 2] [--interval 5] [--seconds 60]

Starts `manage.py serve --workers N` (uvicorn, N processes sharing the port by
SO_REUSEPORT, as production runs it with Redis) on a throwaway PostgreSQL database, joins
the agents through the real API (a few at a time), and has each, from its join on,
heartbeat on its own schedule (spread over the interval, as real agents drift) and read
its desired list as `llmgw-agent` does: when the heartbeat's desired_version changed and
every RELOAD_EVERY heartbeats. The agents' client is this process; the web processes are
others. The heartbeats while agents join, and in the first interval after the last
joined, are shown on their own; the figures after them are the steady state. A call
whose connection is closed unanswered (an overloaded server's header timeout), or that is
answered 503 (its wait for the database past the bound), is counted, and the agent
tries again at its next heartbeat; a join answered 503 is sent again a second later. Each
agent keeps one connection open, as llmgw-agent's client does (the kernel spreads them
over the workers); they speak plain HTTP/1.1 written here rather than through httpx, whose
work for thousands of agents in one process would be timed as the web processes': real
agents each have a machine of their own. Prints heartbeat latency p50/p99, the web
processes' CPU use, and the machine's load average, since other work on the machine shows
in every latency; asserts nothing. Goal: p99 under 20 ms with 5,000 agents on two web
processes (`--agents 5000 --workers 2`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
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

from agent.main import RELOAD_EVERY  # noqa: E402
from bench import webproc  # noqa: E402

logging.getLogger("httpx").setLevel(logging.WARNING)
from django.db import connection  # noqa: E402

# Joins in flight at once.
JOINING = 16


def inventory(i: int) -> dict[str, Any]:
    return {
        "hostname": f"sim-{i:04d}", "agent_version": "bench", "cpu_cores": 64,
        "memory_mb": 512_000, "disk_free_mb": 2_000_000,
        "labels": {"llmgw.io/rack": f"r{i // 20}"}, "engines": {"sim": "1"},
        "cards": [{"index": k, "class": "nvidia-h100-80gb", "memory_mb": 81559, "power_limit_w": 700}
                  for k in range(2)],
        "weights": [], "simulated": True,
    }  # fmt: skip


class Timings:
    """Latencies in milliseconds, kept apart for the joins and the steady state."""

    def __init__(self) -> None:
        self.first: list[float] = []
        self.heartbeats: list[float] = []
        self.desired: list[float] = []
        self.joined = 0
        # Calls of the steady state whose connection was closed unanswered.
        self.failed = 0
        # Calls of the steady state answered 503 (the database slow or away: the web
        # process's bound on a call's wait, docs/agent-protocol.md); and joins so answered.
        self.unavailable = 0
        self.joins_again = 0


class Unavailable(Exception):
    """The call was answered 503: try again later, as llmgw-agent does."""


class Agent:
    """One simulated agent's keep-alive HTTP/1.1 connection to the web process."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.token = ""
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """Send one request; return the status and the JSON answer.

        A connection the server closed while it idled (its keep-alive timeout: agents
        that joined first wait for the last to join) is opened again and the request
        sent again, as llmgw-agent's client does.
        """
        data = json.dumps(body).encode() if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
        if self.token:
            head += f"Authorization: Bearer {self.token}\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        line = b""
        for _ in range(2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
            assert self.reader is not None
            try:
                self.writer.write(head.encode() + b"\r\n" + data)
                line = await self.reader.readline()
            except ConnectionError:
                line = b""
            if line:
                break
            self.close()
        if not line:
            raise ConnectionError(f"{method} {path}: the connection was closed unanswered")
        status = int(line.split()[1])
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            answer = await self.reader.readexactly(int(headers["content-length"]))
        else:  # chunked
            chunks = []
            while size := int((await self.reader.readline()).strip(), 16):
                chunks.append(await self.reader.readexactly(size))
                await self.reader.readline()
            await self.reader.readline()
            answer = b"".join(chunks)
        if status == 503:
            raise Unavailable(f"{method} {path}: HTTP 503: {answer[:300]!r}")
        if status >= 400:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {answer[:300]!r}")
        return status, json.loads(answer)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.writer = None


async def run_agents(
    port: int, secret: str, n: int, interval: float, seconds: float, on_steady: Any
) -> Timings:
    timings = Timings()
    agents = [Agent("127.0.0.1", port) for _ in range(n)]
    # Joined JOINING at a time: a site's agents join as their machines come up, not all
    # in one instant. Each heartbeats from its join on, as llmgw-agent does, so the
    # joins of the last are measured beside the heartbeats of the first.
    joining = asyncio.Semaphore(JOINING)
    started = time.monotonic()
    marks: dict[str, float] = {}
    loop = asyncio.get_running_loop()

    async def run(i: int, a: Agent) -> None:
        body = {"token": secret, "name": f"sim-{i:04d}", "inventory": inventory(i)}
        async with joining:
            while not a.token:
                try:
                    a.token = (await a.call("POST", "/api/v1/agent/join", body))[1]["node_token"]
                except Unavailable:
                    timings.joins_again += 1
                    await asyncio.sleep(1)
        timings.joined += 1
        if timings.joined == n:
            print(f"{n} agents joined in {time.monotonic() - started:.1f} s")
            marks["steady"] = time.monotonic() + interval
            marks["stop"] = marks["steady"] + seconds
            loop.call_at(marks["steady"], on_steady)
        await asyncio.sleep(random.uniform(0, interval))
        version = None
        beats = 0
        while time.monotonic() < marks.get("stop", float("inf")):
            steady = time.monotonic() >= marks.get("steady", float("inf"))
            t = time.perf_counter()
            try:
                _, answer = await a.call(
                    "POST", "/api/v1/agent/heartbeat", {"inventory": inventory(i)}
                )
            except ConnectionError:
                timings.failed += steady
                a.close()
                await asyncio.sleep(interval)
                continue
            except Unavailable:
                timings.unavailable += steady
                await asyncio.sleep(interval)
                continue
            ms = (time.perf_counter() - t) * 1000
            (timings.heartbeats if steady else timings.first).append(ms)
            beats += 1
            if answer["desired_version"] != version or beats >= RELOAD_EVERY:
                t = time.perf_counter()
                try:
                    _, desired = await a.call("GET", "/api/v1/agent/desired")
                except ConnectionError:
                    timings.failed += steady
                    a.close()
                    await asyncio.sleep(interval)
                    continue
                except Unavailable:
                    timings.unavailable += steady
                    await asyncio.sleep(interval)
                    continue
                if steady:
                    timings.desired.append((time.perf_counter() - t) * 1000)
                version = desired["version"]
                beats = 0
            await asyncio.sleep(interval)

    try:
        await asyncio.gather(*(run(i, a) for i, a in enumerate(agents)))
    finally:
        for a in agents:
            a.close()
    return timings


def database_cpu(name: str) -> dict[int, float]:
    """CPU seconds each PostgreSQL backend serving database ``name`` has used: the
    batches' statements, on the server's side (found by their process titles, which
    name the database, so the server must be on this machine)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            title = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if title.startswith("postgres: ") and f" {name} " in title:
            found[int(entry.name)] = webproc.cpu_seconds(int(entry.name))
    return found


def run(coroutine: Any) -> Any:
    """Run the agents on uvloop when it is installed (it is pinned): the client's own
    work for thousands of agents is then the smaller share of the machine."""
    try:
        import uvloop
    except ModuleNotFoundError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


def pct(values: list[float], p: float) -> float:
    """Return the p-th percentile (nearest rank) of some latencies."""
    ordered = sorted(values) or [float("nan")]
    return ordered[max(0, min(len(ordered) - 1, round(len(ordered) * p / 100) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument(
        "--workers", type=int, default=2, help="web processes (manage.py serve --workers)"
    )
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument(
        "--reconciler",
        choices=("worker", "in-process"),
        default="worker",
        help="worker: as in production, the web process only serves (the reconciler runs in "
        "a Celery worker, not started here); in-process: the embedded mode's loop (one web "
        "process only)",
    )
    args = parser.parse_args()
    if args.workers > 1 and args.reconciler == "in-process":
        parser.error("--reconciler in-process is the embedded mode's: one web process only")

    old_name, db_name = webproc.throwaway_database("llmgw_bench_agents")
    from cluster.models import JoinToken

    _, secret = JoinToken.issue("bench")
    connection.close()
    port = webproc.free_port()
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=webproc.database_url(db_name),
        LLMGW_SECRET_KEY="bench", LLMGW_DATA_DIR=f"/tmp/llmgw-bench-{port}",
        LLMGW_NODE_LOST_AFTER="60",
        LLMGW_LOCAL_AGENT="false",
    )  # fmt: skip
    env.pop("LLMGW_REDIS_URL", None)
    if args.reconciler == "worker":
        # Production's layout: with Redis configured the web process does not reconcile.
        env["LLMGW_REDIS_URL"] = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    web = webproc.start(env, port, "agents", args.workers)
    try:
        marks: dict[str, Any] = {}

        def on_steady() -> None:
            marks.update(
                cpu=webproc.cpu_seconds(web.pid), t=time.monotonic(), me=time.process_time(),
                load=os.getloadavg()[0], db=database_cpu(db_name),
            )  # fmt: skip

        timings = run(run_agents(port, secret, args.agents, args.interval, args.seconds, on_steady))
        elapsed = time.monotonic() - marks["t"]
        client_cpu = (time.process_time() - marks["me"]) / elapsed
        cpu = (webproc.cpu_seconds(web.pid) - marks["cpu"]) / elapsed
        # A backend that closed in between is not counted: the web processes' pool keeps
        # its connections while calls come.
        db = sum(t - marks["db"].get(pid, 0.0) for pid, t in database_cpu(db_name).items())
        db /= elapsed
        load = (marks["load"], os.getloadavg()[0])
    finally:
        webproc.stop(web)
        webproc.drop_database(old_name)
    hb, first, desired = timings.heartbeats, timings.first, timings.desired
    print(
        f"while they joined, and the first interval after: {len(first)} heartbeats: "
        f"p50 {pct(first, 50):.1f} ms, p99 {pct(first, 99):.1f} ms"
    )
    print(
        f"steady: {len(hb)} heartbeats from {args.agents} agents every {args.interval:g} s "
        f"over {args.seconds:g} s, and {len(desired)} desired lists (every {RELOAD_EVERY} "
        f"heartbeats, as llmgw-agent reads them); {timings.failed} calls closed unanswered, "
        f"{timings.unavailable} answered 503 (joins answered 503 and sent again: "
        f"{timings.joins_again})"
    )
    print(
        f"  heartbeat p50 {pct(hb, 50):.1f} ms, p90 {pct(hb, 90):.1f} ms, "
        f"p99 {pct(hb, 99):.1f} ms, max {max(hb, default=float('nan')):.1f} ms"
    )
    if desired:
        print(f"  desired list p50 {pct(desired, 50):.1f} ms, p99 {pct(desired, 99):.1f} ms")
    print(f"  reconciler: {args.reconciler}")
    print(
        f"  {args.workers} web process(es), CPU together: {cpu * 100:.0f}% of one core "
        f"({cpu * elapsed / max(1, len(hb) + len(desired)) * 1000:.2f} ms a request); "
        f"the agents' client (this process, same machine): {client_cpu * 100:.0f}%"
    )
    print(
        f"  PostgreSQL's backends for them: {db * 100:.0f}% of one core "
        f"({db * elapsed / max(1, len(hb) + len(desired)) * 1000:.2f} ms a request)"
    )
    print(
        f"  machine: {os.cpu_count()} cores, load average {load[0]:.1f} at the start of "
        f"the steady state, {load[1]:.1f} at its end"
    )
    print(
        f"heartbeat p99 with {args.agents} agents on {args.workers} web process(es): "
        f"{pct(hb, 99):.1f} ms"
    )


if __name__ == "__main__":
    main()
