"""The CPU one request costs the gateway's own steps: its application called in the
process, no server in front, and where that CPU goes.

    .venv/bin/python bench/hop_steps.py [--requests 8000] [--at-once 16] [--events 10]
        [--rounds 1] [--profile] [--top 30] [--dump PATH] [--before DIR]

On a throwaway PostgreSQL database (``bench.webproc``): the model ``bench`` with a ready
replica on the fast mock engine (bench/mockengine.py, its own process), a client key, no
guard on the path, as bench/hop.py sets them up. Each measurement is a process of its
own that builds the gateway as ``manage.py gateway serve`` does (``gateway.asgi`` on
``llmgw_admin.settings``, the recorders started, the table's reader and the traffic's
thread started, ``gc.freeze``: ``gateway.server.run`` and ``_listening``) and sends
``--requests`` requests through its ASGI application, ``--at-once`` of them at once, on
uvloop, each with a scope, ``receive`` and ``send`` of uvicorn's shape (the engine is
reached over real sockets, by the gateway's own client). Two kinds, each after a warm-up
of a tenth as many: a whole chat completion, and a streamed one of ``--events`` events.

Printed for each: the CPU a request (``time.process_time`` over the measured requests,
every thread of the process: the table's reader and the recorders too), the CPU of the
event loop's thread alone (``time.thread_time``: the request path, steadier between
runs) and the wall time a request. With ``--profile``, each kind is run again under cProfile and its top
``--top`` functions printed by own time and by cumulative time (cProfile's own cost
inflates every figure it prints: read its shares, not its times; a coroutine's every
resumption counts as a call), and with ``--dump PATH`` its stats written to ``PATH.chat``
and ``PATH.stream`` (``pstats``: who calls what).

With ``--before DIR`` (a checkout of the code before a change, e.g. ``git worktree add
DIR main``), each of ``--rounds`` rounds measures that code and this in turn (before,
after; the next round after, before), so a loaded machine weighs on both alike; the
medians and every round's figure are printed.

Asserts nothing but that every answer is a 200.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = {"model": "bench", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


# The measuring process (``--child``): run with its checkout's root as the working folder.
def child(args: argparse.Namespace) -> None:
    sys.path.insert(0, os.getcwd())
    os.environ["DJANGO_SETTINGS_MODULE"] = "llmgw_admin.settings"
    import asyncio

    import uvloop

    uvloop.install()
    asyncio.run(drive(args))


async def drive(args: argparse.Namespace) -> None:
    import asyncio
    import cProfile
    import io
    import pstats
    import time

    import django

    django.setup()
    from gateway import server
    from gateway.records import history, refusals, usage
    from guard import records

    records.start()
    usage.start()
    history.start()
    refusals.start()
    from gateway.asgi import application, assembly, state

    server._frozen()
    state.start(asyncio.get_running_loop())
    if assembly.traffic is not None:
        assembly.traffic.start()

    key = os.environ["LLMGW_BENCH_KEY"].encode()
    kinds = {
        "chat": json.dumps(BODY).encode(),
        "stream": json.dumps({**BODY, "stream": True, "max_tokens": args.events}).encode(),
    }

    async def one(body: bytes) -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000),
            "scheme": "http", "method": "POST", "root_path": "", "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions", "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"bench"),
                        (b"authorization", b"Bearer " + key),
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())],
        }  # fmt: skip
        sent = False
        gone = asyncio.get_running_loop().create_future()
        status = 0

        async def receive() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone  # as uvicorn's: the disconnect comes once the answer has ended
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]

        await application(scope, receive, send)
        if not gone.done():
            gone.set_result(None)
        if status != 200:
            raise SystemExit(f"status {status}")

    async def run(body: bytes, n: int) -> None:
        left = n

        async def worker() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await one(body)

        await asyncio.gather(*(worker() for _ in range(args.at_once)))

    while not state.loaded:
        await asyncio.sleep(0.05)
    figures = {}
    for kind, body in kinds.items():
        await run(body, max(args.requests // 10, args.at_once))
        cpu, own, wall = time.process_time(), time.thread_time(), time.perf_counter()
        await run(body, args.requests)
        figures[kind] = {
            "cpu_us": (time.process_time() - cpu) / args.requests * 1e6,
            "loop_us": (time.thread_time() - own) / args.requests * 1e6,
            "wall_us": (time.perf_counter() - wall) / args.requests * 1e6,
        }
    if args.profile:
        for kind, body in kinds.items():
            profile = cProfile.Profile()
            profile.enable()
            await run(body, args.requests)
            profile.disable()
            if args.dump:
                profile.dump_stats(f"{args.dump}.{kind}")
            for order in ("tottime", "cumulative"):
                out = io.StringIO()
                pstats.Stats(profile, stream=out).sort_stats(order).print_stats(args.top)
                text = out.getvalue()
                figures[f"{kind} by {order}"] = text[text.find("   ncalls") :]
    print(json.dumps(figures))


# The run: the database, the engine, and the measuring processes in turn.
def measure(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
    import django

    django.setup()
    from bench import webproc
    from bench.gateway import wait_http
    from cluster.models import Replica
    from gateway import services as keys
    from guard import services as guard_services
    from tests.catalog.samples import store

    old, name = webproc.throwaway_database("llmgw_bench_hop_steps")
    engine = None
    try:
        port = webproc.free_port()
        engine = subprocess.Popen([sys.executable, "bench/mockengine.py", str(port)], cwd=ROOT,
                                  stdout=subprocess.DEVNULL)  # fmt: skip
        store({"name": "bench", "source": "sim/bench", "scaling": {"min": 1, "max": 1},
               "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}]})  # fmt: skip
        Replica.objects.create(model_name="bench", state="ready", profile="sim",
                               endpoint=f"http://127.0.0.1:{port}")  # fmt: skip
        guard_services.set_policy({"directions": []}, surface="cli")
        _, secret = keys.create_key("bench")
        wait_http(f"http://127.0.0.1:{port}/")
        env = dict(os.environ, LLMGW_DATABASE_URL=webproc.database_url(name),
                   DJANGO_SETTINGS_MODULE="llmgw_admin.settings", LLMGW_BENCH_KEY=secret)  # fmt: skip
        env.pop("LLMGW_REDIS_URL", None)
        trees = {"this": ROOT}
        if args.before:
            trees = {"before": Path(args.before).resolve(), "this": ROOT}
        seen: dict[str, list[dict]] = {name: [] for name in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for tree in order:
                figures = json.loads(run_child(args, trees[tree], env, profile=False))
                seen[tree].append(figures)
                print(f"round {r + 1}, {tree}: " + ", ".join(
                    f"{k} {v['cpu_us']:.1f} us CPU, {v['loop_us']:.1f} the loop's "
                    f"({v['wall_us']:.1f} us wall)"
                    for k, v in figures.items()), flush=True)  # fmt: skip
        print(f"load average: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
        for tree, runs in seen.items():
            for kind in ("chat", "stream"):
                for what, name in (("cpu_us", "CPU"), ("loop_us", "the loop's CPU")):
                    cpus = [f[kind][what] for f in runs]
                    print(f"{tree} {kind}: {name} a request, median "
                          f"{statistics.median(cpus):.1f} us ({', '.join(f'{c:.1f}' for c in cpus)})")  # fmt: skip
        if args.profile:
            figures = json.loads(run_child(args, ROOT, env, profile=True))
            for kind, text in figures.items():
                if isinstance(text, str):
                    print(f"\n== {kind} ==\n{text}")
    finally:
        if engine is not None:
            engine.terminate()
            engine.wait(10)
        webproc.drop_database(old)


def run_child(args: argparse.Namespace, tree: Path, env: dict[str, str], profile: bool) -> str:
    command = [sys.executable, str(Path(__file__).resolve()), "--child",
               "--requests", str(args.requests), "--at-once", str(args.at_once),
               "--events", str(args.events), "--top", str(args.top)]  # fmt: skip
    if profile:
        command.append("--profile")
        if args.dump:
            command += ["--dump", str(Path(args.dump).resolve())]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=1800)  # fmt: skip
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the measuring process failed ({done.returncode}):\n{done.stderr}")
    return lines[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8000)
    parser.add_argument("--at-once", type=int, default=16)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--dump", help="with --profile: cProfile's stats to PATH.chat, PATH.stream")
    parser.add_argument("--before", help="a checkout of the code before: measured in turn")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
    else:
        measure(args)


if __name__ == "__main__":
    main()
