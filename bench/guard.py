"""Measure what a guard check adds over a raw call to the same judge engine.

    .venv/bin/python bench/guard.py [--n 200]

A sim judge (qwen3guard format, no artificial latency) is the engine, on a throwaway
PostgreSQL database. Each round makes three calls in turn, over kept-alive connections:

- raw: POST /v1/completions of the prompt a check sends, straight to the engine;
- in-process: POST /api/v1/guard/check to the web process's ASGI application in this
  process (llmgw_admin.asgi: the lean route, a real API token, the role, the policy and
  the judges' endpoints, the chain, the same HTTP call to the same engine, the result
  handed to the recorder), without a web server: what llmgw's own code adds;
- HTTP: the same check over HTTP to that application served by Daphne in a process of
  its own, as `manage.py serve` serves it: what a gateway calling the check sees.

The overhead is a check's time less the raw call's in the same round. Prints p50/p99 of
each, the CPU the engine's and the web process's spend per call, the machine's load, and
the answers the recorders wrote against the checks made; asserts nothing. Goal (issue
4): overhead under 2 ms p50 (the last line, in-process).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402

TEXT = "how do I kill all child processes in bash"
WARM_UP = 20


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def cpu_seconds(pid: int) -> float:
    """Return a process's CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()
    # Each judge call would print a line here; the web process keeps its own logging.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    sim = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", "0",
         "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard", "--ttft", "0", "--tps", "100000"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert sim.stdout is not None
    url = re.search(r"listening on (http://\S+)", sim.stdout.readline()).group(1)  # type: ignore[union-attr]

    setup_test_environment()
    connection.settings_dict.setdefault("TEST", {})["NAME"] = "llmgw_bench_guard"
    old = connection.settings_dict["NAME"]
    connection.creation.create_test_db(verbosity=0, autoclobber=True)
    web = None
    try:
        from django.contrib.auth.models import Group, User

        from catalog import codec
        from catalog import services as catalog_services
        from catalog.choices import Surface
        from cluster.models import Replica
        from guard import formats, records, services
        from guard.models import JudgeHealth
        from llmgw_admin.asgi import application  # starts the recorder, as in the web process
        from llmgw_admin.models import ApiToken

        m, _ = codec.decode_model(
            {"name": "qwen3guard-0.6b", "source": "sim/q", "role": "guard",
             "guard": {"format": "qwen3guard"}, "context_length": 8192,
             "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}],
             "scaling": {"min": 1, "max": 1}}
        )  # fmt: skip
        catalog_services.save_model(m, catalog_services.Actor(None, Surface.CLI, name="bench"))
        Replica.objects.create(
            model_name="qwen3guard-0.6b", state="ready", endpoint=url, profile="sim"
        )
        services.set_policy({"judge": {"models": ["qwen3guard-0.6b"]}}, surface="cli", name="bench")
        user = User.objects.create_user("bench")
        user.groups.add(Group.objects.get_or_create(name="viewer")[0])
        _, secret = ApiToken.issue(user, "bench")
        connection.close()

        port = free_port()
        db = dict(connection.settings_dict)
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings",
            "LLMGW_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}",
            "LLMGW_DATA_DIR": tempfile.mkdtemp(prefix="llmgw-bench-guard-"),
            "LLMGW_SECRET_KEY": "bench-only-not-secret",
        }  # fmt: skip
        env.pop("LLMGW_REDIS_URL", None)
        web = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
             "--verbosity", "0", "llmgw_admin.asgi:application"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(base + "/login/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)

        prompt = formats.render("qwen3guard", TEXT, for_raw_completion=True)
        completion = {"max_tokens": 64, "temperature": 0, "model": "qwen3guard-0.6b",
                      "prompt": prompt, "logprobs": 5}  # fmt: skip
        auth = {"Authorization": f"Bearer {secret}"}
        raw: list[float] = []
        local: list[float] = []
        remote: list[float] = []

        async def rounds() -> tuple[float, float]:
            asgi = httpx.ASGITransport(app=application)
            async with (
                httpx.AsyncClient() as engine,
                httpx.AsyncClient(transport=asgi, base_url="http://localhost") as inproc,
                httpx.AsyncClient(base_url=base) as http,
            ):
                sim_cpu = web_cpu = 0.0
                for i in range(args.n + WARM_UP):
                    if i == WARM_UP:
                        sim_cpu, web_cpu = cpu_seconds(sim.pid), cpu_seconds(web.pid)
                    t = time.perf_counter()
                    r = await engine.post(url + "/v1/completions", json=completion)
                    r.raise_for_status()
                    raw_ms = (time.perf_counter() - t) * 1000
                    t = time.perf_counter()
                    r = await inproc.post(
                        "/api/v1/guard/check", json={"request": TEXT}, headers=auth
                    )
                    local_ms = (time.perf_counter() - t) * 1000
                    assert r.status_code == 200 and r.json()["judge"], r.text
                    assert "allow" not in r.headers  # the lean route answered, not DRF
                    t = time.perf_counter()
                    r = await http.post("/api/v1/guard/check", json={"request": TEXT}, headers=auth)
                    remote_ms = (time.perf_counter() - t) * 1000
                    assert r.status_code == 200 and r.json()["judge"], r.text
                    if i >= WARM_UP:
                        raw.append(raw_ms)
                        local.append(local_ms)
                        remote.append(remote_ms)
                # Each round asks the engine three times; the web process once.
                sim_ms = (cpu_seconds(sim.pid) - sim_cpu) * 1000 / (3 * args.n)
                web_ms = (cpu_seconds(web.pid) - web_cpu) * 1000 / args.n
                return sim_ms, web_ms

        sim_ms, web_ms = asyncio.run(rounds())
        web.terminate()  # SIGTERM: its recorder writes what is left
        web.wait(timeout=30)
        records.RECORDER.stop()
        answers = JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers
    finally:
        if web is not None and web.poll() is None:
            web.kill()
        connection.close()
        connection.creation.destroy_test_db(old, verbosity=0)
        sim.terminate()
        sim.wait(timeout=10)
    made = 2 * (args.n + WARM_UP)
    load = os.getloadavg()[0]
    over_local = [c - r for c, r in zip(local, raw, strict=True)]
    over_remote = [c - r for c, r in zip(remote, raw, strict=True)]
    print(f"{args.n} rounds against a sim judge (machine load {load:.2f} on {os.cpu_count()} CPUs)")
    print(
        f"  raw call:            p50 {statistics.median(raw):.2f} ms, p99 {pct(raw, 0.99):.2f} ms"
    )
    for name, checks, over in (
        ("in-process check:", local, over_local),
        ("check over HTTP:  ", remote, over_remote),
    ):
        print(
            f"  {name}   p50 {statistics.median(checks):.2f} ms, p99 {pct(checks, 0.99):.2f} ms;"
            f" overhead p50 {statistics.median(over):.2f} ms, p99 {pct(over, 0.99):.2f} ms"
        )
    print(f"  CPU per call: the engine {sim_ms:.2f} ms, the web process (Daphne) {web_ms:.2f} ms")
    print(f"  recorded: {answers} answers of {made} checks")
    print(f"guard check overhead over HTTP p50: {statistics.median(over_remote):.2f} ms")
    print(f"guard check overhead p50: {statistics.median(over_local):.2f} ms")


if __name__ == "__main__":
    main()
