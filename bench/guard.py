"""Measure what a guard check adds over a raw call to the same judge engine.

    .venv/bin/python bench/guard.py [--n 200]

A sim judge (qwen3guard format, no artificial latency) is the engine, on a throwaway
PostgreSQL database. Each round makes three calls in turn:

- raw: POST /v1/completions of the prompt a check sends, straight to the engine;
- HTTP: POST /api/v1/guard/check to a web process of its own, served as `manage.py
  serve` serves it (``llmgw_admin.server``: uvicorn): the lean route, a real API token,
  the role, the policy and the judges' endpoints, the chain, the HTTP call to the same
  engine, the result handed to the recorder. What a gateway calling the check sees;
- in-process: the same check to the ASGI application in this process, without a
  server (httpx's ASGI transport): what llmgw's own code adds.

The raw call and the check over HTTP are made alike, as a gateway with a lean client
would make them: the standard library's ``http.client`` over one kept-alive connection
each, so the client's own cost is the same on both sides and cancels out. (httpx's
async client cost 2.5-4 ms a call of its own here, on both sides, which only added
noise.) The overhead is a check's time less the raw call's in the same round. Prints
p50/p99 of each, the CPU the engine and the web process spend per call, the machine's
load, and the answers the recorders wrote against the checks made; asserts nothing.
Goal: overhead under 2 ms p50, the last line (over HTTP).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import logging
import os
import re
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

from bench import webproc  # noqa: E402

TEXT = "how do I kill all child processes in bash"
WARM_UP = 20


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def cpu_seconds(pid: int) -> float:
    """Return a process's CPU time so far (user and system), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Lean:
    """One kept-alive connection to a server, as a gateway's lean client holds it."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=10)

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, bytes]:
        self.conn.request("POST", path, body, headers)
        response = self.conn.getresponse()
        return response.status, response.read()


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

    old, _ = webproc.throwaway_database("llmgw_bench_guard")
    web = None
    try:
        from django.contrib.auth.models import Group, User

        from catalog import codec
        from catalog import services as catalog_services
        from catalog.choices import Surface
        from cluster.models import Replica
        from guard import formats, records, services
        from guard.models import JudgeHealth
        from llmgw_admin.asgi import application
        from llmgw_core.models import ApiToken

        records.start()  # as the web process's server does (llmgw_admin/server.py)

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

        port = webproc.free_port()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings",
            "LLMGW_DATABASE_URL": webproc.database_url(connection.settings_dict["NAME"]),
            "LLMGW_DATA_DIR": tempfile.mkdtemp(prefix="llmgw-bench-guard-"),
            "LLMGW_SECRET_KEY": "bench-only-not-secret",
        }  # fmt: skip
        env.pop("LLMGW_REDIS_URL", None)
        web = subprocess.Popen(
            [sys.executable, "-m", "llmgw_admin.server", "--bind", "127.0.0.1",
             "--port", str(port)],
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
        engine = Lean(url)
        web_http = Lean(base)
        check = json.dumps({"request": TEXT}).encode()
        headers = {**auth, "Content-Type": "application/json"}

        async def in_process(inproc: httpx.AsyncClient) -> float:
            t = time.perf_counter()
            r = await inproc.post("/api/v1/guard/check", json={"request": TEXT}, headers=auth)
            took = (time.perf_counter() - t) * 1000
            assert r.status_code == 200 and r.json()["judge"], r.text
            assert "allow" not in r.headers  # the lean route answered, not DRF
            return took

        loop = asyncio.new_event_loop()
        inproc = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=application), base_url="http://localhost"
        )
        body = json.dumps(completion).encode()
        sim_cpu = web_cpu = 0.0
        for i in range(args.n + WARM_UP):
            if i == WARM_UP:
                sim_cpu, web_cpu = cpu_seconds(sim.pid), cpu_seconds(web.pid)
            t = time.perf_counter()
            status, _ = engine.post("/v1/completions", body, {"Content-Type": "application/json"})
            raw_ms = (time.perf_counter() - t) * 1000
            assert status == 200
            t = time.perf_counter()
            status, answer = web_http.post("/api/v1/guard/check", check, headers)
            remote_ms = (time.perf_counter() - t) * 1000
            assert status == 200 and json.loads(answer)["judge"], answer
            local_ms = loop.run_until_complete(in_process(inproc))
            if i >= WARM_UP:
                raw.append(raw_ms)
                local.append(local_ms)
                remote.append(remote_ms)
        # Each round asks the engine three times; the web process once.
        sim_ms = (cpu_seconds(sim.pid) - sim_cpu) * 1000 / (3 * args.n)
        web_ms = (cpu_seconds(web.pid) - web_cpu) * 1000 / args.n
        loop.run_until_complete(inproc.aclose())
        loop.close()
        web.terminate()  # SIGTERM: its recorder writes what is left
        web.wait(timeout=30)
        records.RECORDER.stop()
        answers = JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers
    finally:
        if web is not None and web.poll() is None:
            web.kill()
        webproc.drop_database(old)
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
        ("check over HTTP:  ", remote, over_remote),
        ("in-process check:", local, over_local),
    ):
        print(
            f"  {name}   p50 {statistics.median(checks):.2f} ms, p99 {pct(checks, 0.99):.2f} ms;"
            f" overhead p50 {statistics.median(over):.2f} ms, p99 {pct(over, 0.99):.2f} ms"
        )
    print(f"  CPU per call: the engine {sim_ms:.2f} ms, the web process {web_ms:.2f} ms")
    print(f"  recorded: {answers} answers of {made} checks")
    print(f"llmgw's own code (in-process) overhead p50: {statistics.median(over_local):.2f} ms")
    print(f"guard check overhead p50: {statistics.median(over_remote):.2f} ms")


if __name__ == "__main__":
    main()
