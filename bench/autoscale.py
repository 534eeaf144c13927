"""Measure how the cluster reacts to its load: load scaling (issue 20, item 1), and, added
by its own section, admission by priority band (item 3).

    .venv/bin/python bench/autoscale.py [--up 10] [--down 20] [--clients 8]

Starts `manage.py serve` (embedded: the gateway, the reconciler's loop and the load
reports in the one web process, reconciling every second) on a throwaway PostgreSQL
database, and a simulated node's agent with sim engines. Each section then drives the
gateway with openai clients (tests/e2e/faultplane.Load) and reads the database every
50 ms. Prints figures; asserts nothing.

Sections (each a function taking the running ``Setup``; ``main`` runs them in order):

- ``scaling``: a min 1 / max 3 model of capacity 2 a replica. ``--clients`` clients
  start at once: ``scale-up reaction`` is the time from the load's start to the replicas
  wanted going up (``LLMGW_SCALE_UP_AFTER`` plus the report's and the tick's delays),
  with when the new replicas were ready. The load stops: ``scale-down reaction`` is the
  time from its end to the first replica given up (``LLMGW_SCALE_DOWN_AFTER`` plus the
  same delays), with when it was back at its min.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import logging  # noqa: E402

import django  # noqa: E402

django.setup()
logging.getLogger("httpx").setLevel(logging.WARNING)  # a line a request otherwise

from django.db import connection  # noqa: E402

from bench import webproc  # noqa: E402

H100 = "nvidia-h100-80gb"
# A request takes the sim about 0.4 s: a client is in flight most of the time.
SLOW = {"LLMGW_SIM_TTFT": "0.3", "LLMGW_SIM_TPS": "20"}


@dataclass
class Setup:
    """What the sections share: the web process's URL, its environment, a client key."""

    url: str
    env: dict[str, str]
    key: str
    args: argparse.Namespace
    figures: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        print(line, flush=True)
        self.figures.append(line)


def wait(check: Callable[[], object], within: float, what: str, every: float = 0.05) -> float:
    """Seconds until ``check()`` is true (the database read again each time)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > within:
            raise SystemExit(f"{what} did not happen within {within:g} s")
        time.sleep(every)
        connection.close()
    return time.monotonic() - t0


def store(data: dict[str, object]) -> None:
    from catalog import codec, services
    from catalog.choices import Surface

    m, problems = codec.decode_model(data)
    assert not problems, problems
    services.save_model(m, services.Actor(user=None, surface=Surface.CLI, name="bench"))


# -- load scaling (issue 20, item 1) ------------------------------------------------------


def scaling(s: Setup) -> None:
    from cluster.models import Replica
    from tests.e2e.faultplane import Load

    name = "elastic"
    store({"name": name, "source": f"sim/{name}", "scaling": {"min": 1, "max": 3},
           "profiles": [{"name": "sim", "engine": "sim", "gpu_class": H100, "tp": 1,
                         "env": dict(SLOW), "capacity": 2}]})  # fmt: skip

    def wanted() -> int:
        return Replica.objects.filter(model_name=name, desired=True).count()

    def ready() -> int:
        return Replica.objects.filter(model_name=name, desired=True, state="ready").count()

    wait(lambda: ready() == 1, 120, "the first replica ready")
    load = Load([s.url], s.key, name, clients=s.args.clients, pause=0.02)
    t0 = time.monotonic()
    load.start()
    try:
        wait(lambda: wanted() > 1, s.args.up + 60, "a scale-up")
        up = time.monotonic() - t0
        target = wanted()
        wait(lambda: ready() >= target, 120, "the new replicas ready")
        up_ready = time.monotonic() - t0
    finally:
        load.stop()
    t1 = time.monotonic()
    wait(lambda: wanted() < target, s.args.down + 60, "a scale-down")
    down = time.monotonic() - t1
    wait(lambda: wanted() == 1, 2 * s.args.down + 90, "back at min")
    at_min = time.monotonic() - t1
    s.say(f"scaling: {s.args.clients} clients on a min 1 / max 3 model of capacity 2; "
          f"LLMGW_SCALE_UP_AFTER {s.args.up} s, LLMGW_SCALE_DOWN_AFTER {s.args.down} s, "
          f"reconcile every 1 s; {load.summary()}")  # fmt: skip
    s.say(f"scale-up reaction: {up:.1f} s")
    s.say(f"  to {target} wanted at once; ready {up_ready:.1f} s after the load began")
    s.say(f"scale-down reaction: {down:.1f} s")
    s.say(f"  back at min 1 {at_min:.1f} s after the load ended (one replica a window)")


# The sections, in order. Admission by priority band (issue 20, item 3) goes here as its
# own function, ``admission(s)``, printing its lines through ``s.say``.
SECTIONS: list[Callable[[Setup], None]] = [scaling]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--up", type=int, default=10, help="LLMGW_SCALE_UP_AFTER (s)")
    parser.add_argument("--down", type=int, default=20, help="LLMGW_SCALE_DOWN_AFTER (s)")
    parser.add_argument("--clients", type=int, default=8, help="clients of the load")
    args = parser.parse_args()

    old_name, db_name = webproc.throwaway_database("llmgw_bench_autoscale")
    from cluster.models import JoinToken

    _, secret = JoinToken.issue("bench")
    connection.close()
    port = webproc.free_port()
    data = Path(f"/tmp/llmgw-bench-autoscale-{port}")
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=webproc.database_url(db_name),
        LLMGW_SECRET_KEY="bench", LLMGW_DATA_DIR=str(data), LLMGW_LOCAL_AGENT="false",
        LLMGW_RECONCILE_INTERVAL="1", LLMGW_SCALE_UP_AFTER=str(args.up),
        LLMGW_SCALE_DOWN_AFTER=str(args.down),
    )  # fmt: skip
    env.pop("LLMGW_REDIS_URL", None)
    web = webproc.start(env, port, "autoscale")
    url = f"http://127.0.0.1:{port}"
    data.mkdir(parents=True, exist_ok=True)
    agent_log = (data / "agent.log").open("ab")  # noqa: SIM115
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent", "--server", url, "--join-token", secret,
         "--name", "bench-node", "--state-dir", str(data / "agent"), "--heartbeat", "1s",
         "--simulate", f"4x {H100}", "--stop-engines-on-exit"],
        cwd=ROOT, stdout=agent_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        made = subprocess.run(
            [sys.executable, "manage.py", "gateway", "key", "create", "bench"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        setup = Setup(url, env, made.stdout.strip().splitlines()[-1], args)
        print(f"machine load {os.getloadavg()[0]:.1f}; logs in {data}", flush=True)
        for section in SECTIONS:
            section(setup)
    finally:
        agent.terminate()
        try:
            agent.wait(timeout=30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        webproc.stop(web)
        webproc.drop_database(old_name)


if __name__ == "__main__":
    main()
