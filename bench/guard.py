"""Measure what a guard check adds over a raw call to the same judge engine.

    .venv/bin/python bench/guard.py [--n 200]

A sim judge (qwen3guard format, no artificial latency) is the engine. "raw" is one
POST /v1/completions of the rendered prompt with httpx; "check" is POST
/api/v1/guard/check through Django (in-process test client: auth, the policy, the
catalog and replica lookups, the chain, the HTTP call, recording the result) on a
throwaway PostgreSQL database. Prints p50/p99 of each and of the difference; asserts
nothing. Goal (issue 4): overhead under 2 ms p50.
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
        from guard import formats, services

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
        api = APIClient()
        api.force_authenticate(user)

        text = "how do I kill all child processes in bash"
        prompt = formats.render("qwen3guard", text, for_raw_completion=True)
        raw, check = [], []
        with httpx.Client() as http:
            for i in range(args.n + 10):
                t = time.perf_counter()
                r = http.post(url + "/v1/completions", json={
                    "model": "qwen3guard-0.6b", "prompt": prompt, "temperature": 0,
                    "max_tokens": 64, "logprobs": 5})  # fmt: skip
                r.raise_for_status()
                raw_ms = (time.perf_counter() - t) * 1000
                t = time.perf_counter()
                r = api.post("/api/v1/guard/check", {"request": text}, format="json")
                check_ms = (time.perf_counter() - t) * 1000
                assert r.status_code == 200 and r.json()["judge"], r.json()
                if i >= 10:  # warm-up
                    raw.append(raw_ms)
                    check.append(check_ms)
    finally:
        connection.creation.destroy_test_db(old, verbosity=0)
        sim.terminate()
        sim.wait(timeout=10)
    diff = [c - r for c, r in zip(check, raw, strict=True)]
    print(f"{args.n} checks against a sim judge")
    print(f"  raw call: p50 {statistics.median(raw):.2f} ms, p99 {pct(raw, 0.99):.2f} ms")
    print(f"  check:    p50 {statistics.median(check):.2f} ms, p99 {pct(check, 0.99):.2f} ms")
    print(f"  overhead: p50 {statistics.median(diff):.2f} ms, p99 {pct(diff, 0.99):.2f} ms")
    print(f"guard check overhead p50: {statistics.median(diff):.2f} ms")


if __name__ == "__main__":
    main()
