"""Measure how the cluster reacts to its load: load scaling, and
admission by priority band.

    .venv/bin/python bench/autoscale.py [--up 10] [--down 20] [--clients 8] [--only admission]

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
- ``admission``: ``admission decision p50`` (``gateway.path.admission``'s check, in this
  process); then a model of capacity 2 on a sim whose TTFT grows fivefold per request
  beside it (0.5 s alone, 3 s at two in flight, 8 s at four), with a 5 s TTFT slo,
  offered twice that by a high and a low key (``--overload`` seconds): the high band's
  TTFT p99 against its slo (once the low requests admitted before the first hold have
  ended, and over the whole run), the low band's 429s and how many of its requests the
  allowance let in, and when each band is answered again once the load falls.
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


# -- load scaling ------------------------------------------------------


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


# -- admission by priority band -----------------------------------------


def admission_decision(s: Setup) -> None:
    """The decision's own time, in this process: a model past its slo, a window of
    samples, ``Admission.check`` for a low and a high key."""
    from gateway.path.admission import Admission

    a = Admission(window=10.0)
    for i in range(2000):
        a.record("m", 0.2 + (i % 50) / 10)  # up to 5 s: past a 1 s slo
    took = []
    for i in range(20000):
        band = "low" if i % 2 else "high"
        t = time.perf_counter_ns()
        a.check("m", band, 1000.0)
        took.append(time.perf_counter_ns() - t)
    took.sort()
    s.say(f"admission decision p50: {took[len(took) // 2] / 1000:.1f} us")
    s.say(f"  p99 {took[len(took) * 99 // 100] / 1000:.1f} us (a window of 10 s, 21 buckets a "
          "second and the last first tokens read on each check; 3.2 us at p50 before the "
          "lower bands' allowance, on the same machine)")  # fmt: skip


def admission(s: Setup) -> None:
    """A model of capacity 2 on a sim that slows fivefold per request beside another
    (``--slowdown 5``, 8 slots: no request queues for one) offered twice that by a high and
    a low key (two streaming clients each, no pause): the high band's TTFT p99 against the
    slo, the low band's 429s, then both back once the load falls."""
    import openai

    from cluster.models import Replica
    from tests.e2e.bandload import BandLoad, p99

    admission_decision(s)
    name, slo_ms = "banded", 5000
    sim = {"LLMGW_SIM_TTFT": "0.5", "LLMGW_SIM_TPS": "200", "LLMGW_SIM_PARALLEL": "8",
           "LLMGW_SIM_SLOWDOWN": "5"}  # fmt: skip
    store({"name": name, "source": f"sim/{name}", "scaling": {"min": 1, "max": 1},
           "slo": {"ttft_p99": f"{slo_ms}ms"},
           "profiles": [{"name": "sim", "engine": "sim", "gpu_class": H100, "tp": 1,
                         "env": sim, "capacity": 2}]})  # fmt: skip
    wait(lambda: Replica.objects.filter(model_name=name, state="ready").exists(), 120,
         "the banded model's replica ready")  # fmt: skip
    keys = {}
    for band in ("high", "low"):
        made = subprocess.run(
            [sys.executable, "manage.py", "gateway", "key", "create", f"bench-{band}",
             "--priority", band],
            cwd=ROOT, env=s.env, capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        keys[band] = made.stdout.strip().splitlines()[-1]
    time.sleep(1.5)  # the gateway reads new keys within a second
    high = BandLoad(s.url, keys["high"], name, clients=2)
    low = BandLoad(s.url, keys["low"], name, clients=2)
    t0 = time.monotonic()
    high.start(t0)
    low.start(t0)
    time.sleep(s.args.overload)
    high.stop()
    low.stop()
    held = [a for a in low.answers if a.status == 429]
    first_hold = min((a.at for a in held), default=float("inf"))
    # The steady state: once the lows admitted before the first hold have ended.
    steady_from = max([first_hold, *(a.end for a in low.answers
                                     if a.status == 200 and a.at < first_hold)])  # fmt: skip
    high_ok = [a.ttft for a in high.answers if a.status == 200 and a.ttft is not None]
    steady = [a.ttft for a in high.answers
              if a.status == 200 and a.ttft is not None and a.at >= steady_from]  # fmt: skip
    let_in = [a for a in low.answers if a.status == 200 and a.at >= steady_from]
    s.say(f"admission: slo ttft_p99 {slo_ms} ms; 2 high + 2 low streaming clients on a "
          f"model of capacity 2 for {s.args.overload} s")  # fmt: skip
    s.say(f"high band TTFT p99 under overload: {p99(steady) * 1000:.0f} ms against its slo "
          f"{slo_ms} ms (from {steady_from:.1f} s in, {len(steady)} answers; "
          f"{p99(high_ok) * 1000:.0f} ms over the whole run, {len(high_ok)} answers); "
          f"high 429s: {sum(a.status == 429 for a in high.answers)}")  # fmt: skip
    retry = sorted({a.retry_after for a in held})
    s.say(f"  low band: {len(held)} of {len(low.answers)} refused 429 (Retry-After "
          f"{', '.join(retry) or '-'}), first {first_hold:.1f} s in; {len(let_in)} let in "
          "by the allowance from then on")  # fmt: skip
    # The load falls: one request a second from each; when is each band answered again.
    back: dict[str, float] = {}
    fell = time.monotonic()
    while len(back) < 2 and time.monotonic() - fell < 60:
        for band, load in (("high", high), ("low", low)):
            if band not in back:
                c = openai.OpenAI(base_url=s.url + "/v1", api_key=keys[band], max_retries=0)
                if load.ask(c).status == 200:
                    back[band] = time.monotonic() - fell
        time.sleep(1.0)
    s.say("  after the load fell, answered again: " + ", ".join(
        f"{b} {back[b]:.1f} s" if b in back else f"{b} not within 60 s" for b in ("high", "low")
    ) + " (LLMGW_ADMISSION_WINDOW 10 s)")  # fmt: skip


# The sections, in order.
SECTIONS: list[Callable[[Setup], None]] = [scaling, admission]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--up", type=int, default=10, help="LLMGW_SCALE_UP_AFTER (s)")
    parser.add_argument("--down", type=int, default=20, help="LLMGW_SCALE_DOWN_AFTER (s)")
    parser.add_argument("--clients", type=int, default=8, help="clients of the load")
    parser.add_argument("--overload", type=int, default=40,
                        help="seconds of the admission section's overload")  # fmt: skip
    parser.add_argument("--only", choices=[f.__name__ for f in SECTIONS],
                        help="run this section alone")  # fmt: skip
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
            if not args.only or section.__name__ == args.only:
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
