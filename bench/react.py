"""Measure how long an operator's change takes to act: a model posted, its replica placed.

    .venv/bin/python bench/react.py [--n 20] [--mode embedded|production]

Starts `manage.py serve` on a throwaway PostgreSQL database: embedded (the reconciler's
loop in the web process) or production (Redis set, with a Celery worker and beat started
here, as docs/production.md runs them). A node with an H100 per model joins through the agent
API's service. Then, one at a time and at random moments (so the reconciler's schedule is
met at every phase), a script posts a new model with an API token, and this process reads
the database every 5 ms until the model's replica is placed on the node. Prints the
time from sending the POST to the placement, p50/p95/max, with the reconcile interval;
asserts nothing. Before the reconciler was woken by changes (cluster/wake.py) this was the
wait for the next tick: on average half of LLMGW_RECONCILE_INTERVAL.
"""

from __future__ import annotations

import argparse
import os
import random
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

from bench import webproc  # noqa: E402

H100 = "nvidia-h100-80gb"
INTERVAL = 5


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20)
    parser.add_argument("--mode", choices=("embedded", "production"), default="embedded")
    args = parser.parse_args()

    old_name, db_name = webproc.throwaway_database("llmgw_bench_react")
    from django.contrib.auth.models import Group, User

    from cluster import agentjoin
    from cluster.models import Assignment, JoinToken
    from llmgw_core.models import ApiToken
    from llmgw_core.roles import OPERATOR
    from tests.cluster.helpers import inventory

    _, secret = JoinToken.issue("bench")
    # A card per model: each keeps its replica (no agent is here to stop one).
    agentjoin.join(secret, "bench-node", inventory([H100] * args.n, hostname="bench-node"))
    user = User.objects.create_user("bench-operator", password="x", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name=OPERATOR)[0])
    _, token = ApiToken.issue(user, "bench")
    connection.close()

    port = webproc.free_port()
    data = Path(f"/tmp/llmgw-bench-react-{port}")
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=webproc.database_url(db_name),
        LLMGW_SECRET_KEY="bench", LLMGW_DATA_DIR=str(data), LLMGW_LOCAL_AGENT="false",
        LLMGW_NODE_LOST_AFTER="3600", LLMGW_RECONCILE_INTERVAL=str(INTERVAL),
    )  # fmt: skip
    env.pop("LLMGW_REDIS_URL", None)
    others: list[subprocess.Popen[bytes]] = []
    if args.mode == "production":
        env["LLMGW_REDIS_URL"] = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/12")
        import redis

        redis.Redis.from_url(env["LLMGW_REDIS_URL"]).flushdb()
        data.mkdir(parents=True, exist_ok=True)
        for what in (["worker"], ["beat", "--schedule", str(data / "beat-schedule")]):
            others.append(
                subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "llmgw_admin", *what, "-l", "WARNING"],
                    cwd=ROOT,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )  # fmt: skip
            )
    web = webproc.start(env, port, "react")
    waits: list[float] = []
    try:
        client = httpx.Client(
            base_url=f"http://127.0.0.1:{port}/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )
        time.sleep(2 * INTERVAL)  # the worker and beat up; the first ticks done
        for i in range(args.n):
            time.sleep(random.uniform(0, INTERVAL))
            name = f"react-{i}"
            model = {
                "name": name,
                "source": f"sim/{name}",
                "profiles": [{"name": "sim", "engine": "sim", "gpu_class": H100}],
                "scaling": {"min": 1, "max": 1},
            }
            placed = Assignment.objects.filter(replica__model_name=name)
            t0 = time.monotonic()
            r = client.post("/catalog/models/", json=model)
            assert r.status_code == 201, r.text
            while not placed.exists():
                if time.monotonic() - t0 > 4 * INTERVAL:
                    raise SystemExit(f"{name} was not placed within {4 * INTERVAL} s")
                time.sleep(0.005)
            waits.append((time.monotonic() - t0) * 1000)
        connection.close()
    finally:
        webproc.stop(web)
        for proc in others:
            proc.terminate()
            proc.wait(timeout=20)
        webproc.drop_database(old_name)
    print(
        f"{args.mode}: {len(waits)} models posted at random moments, reconcile interval "
        f"{INTERVAL} s; machine load {os.getloadavg()[0]:.1f}"
    )
    print(
        f"  POST to placement: p50 {pct(waits, 50):.0f} ms, p95 {pct(waits, 95):.0f} ms, "
        f"max {max(waits):.0f} ms"
    )
    print(f"change to placement p50 ({args.mode}): {pct(waits, 50):.0f} ms")


if __name__ == "__main__":
    main()
