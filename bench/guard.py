"""Measure what a guard check adds over a raw call to the same judge engine.

    .venv/bin/python bench/guard.py [--n 200]

A sim judge (qwen3guard format, no artificial latency) is the engine. "raw" is one
POST /v1/completions of the rendered prompt with httpx (a kept-alive connection); "check"
is POST /api/v1/guard/check through Django (in-process test client, so no web server's
own cost: middleware, a real API token's authentication, the role, the policy and the
judges' endpoints, the chain, the same HTTP call to the same engine over a kept-alive
connection, the result handed to the recorder) on a throwaway PostgreSQL database. The
recorder's thread runs as in the web process, and the counts it wrote are compared with
the checks made. Raw and check calls alternate. Prints p50/p99 of each and of the
difference; asserts nothing. Goal (issue 4): overhead under 2 ms p50.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
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


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=200)
    args = parser.parse_args()

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
    try:
        from django.contrib.auth.models import Group, User
        from rest_framework.test import APIClient

        from catalog import codec
        from catalog import services as catalog_services
        from catalog.choices import Surface
        from cluster.models import Replica
        from guard import formats, records, services
        from guard.models import JudgeHealth
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
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        records.start()  # as llmgw_admin/asgi.py does in the web process

        text = "how do I kill all child processes in bash"
        prompt = formats.render("qwen3guard", text, for_raw_completion=True)
        raw, check, cpu = [], [], []
        with httpx.Client() as http:
            for i in range(args.n + 10):
                t, c = time.perf_counter(), time.thread_time()
                r = http.post(url + "/v1/completions", json={
                    "model": "qwen3guard-0.6b", "prompt": prompt, "temperature": 0,
                    "max_tokens": 64, "logprobs": 5})  # fmt: skip
                r.raise_for_status()
                raw_ms = (time.perf_counter() - t) * 1000
                raw_cpu_ms = (time.thread_time() - c) * 1000
                t, c = time.perf_counter(), time.thread_time()
                r = api.post("/api/v1/guard/check", {"request": text}, format="json")
                check_ms = (time.perf_counter() - t) * 1000
                check_cpu_ms = (time.thread_time() - c) * 1000
                assert r.status_code == 200 and r.json()["judge"], r.json()
                if i >= 10:  # warm-up
                    raw.append(raw_ms)
                    check.append(check_ms)
                    cpu.append(check_cpu_ms - raw_cpu_ms)
        records.RECORDER.stop()
        answers = JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers
    finally:
        connection.creation.destroy_test_db(old, verbosity=0)
        sim.terminate()
        sim.wait(timeout=10)
    diff = [c - r for c, r in zip(check, raw, strict=True)]
    print(f"{args.n} checks against a sim judge ({answers} answers recorded of {args.n + 10})")
    print(f"  raw call: p50 {statistics.median(raw):.2f} ms, p99 {pct(raw, 0.99):.2f} ms")
    print(f"  check:    p50 {statistics.median(check):.2f} ms, p99 {pct(check, 0.99):.2f} ms")
    print(f"  overhead: p50 {statistics.median(diff):.2f} ms, p99 {pct(diff, 0.99):.2f} ms")
    # CPU time of this thread, which a busy machine inflates less than the wall clock.
    print(f"  overhead, CPU of the calling thread: p50 {statistics.median(cpu):.2f} ms")
    print(f"  machine load (1 min) {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    print(f"guard check overhead p50: {statistics.median(diff):.2f} ms")


if __name__ == "__main__":
    main()
