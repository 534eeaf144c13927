"""The gateway's hop beside nginx's, measured in one run: one gateway process,
``gateway serve --workers 2``, and a plain nginx proxy (one worker), each in front of the
same fast mock engine (bench/mockengine.py).

    .venv/bin/python bench/hop.py [--seconds 5] [--rounds 3] [--connections 64] [--before DIR]

Needs ``nginx`` and ``wrk`` on the PATH (Debian's ``nginx-light`` and ``wrk``; the bench's
own, never the project's). On a throwaway PostgreSQL database: the model ``bench`` with
a ready replica on the mock engine, a client key, no guard on the path. nginx keeps its
connections to the engine alive (``keepalive``, HTTP/1.1) and passes streams unbuffered,
as the gateway does. Every phase interleaves the targets, so a machine whose load moves
during the run moves them all alike. Printed for each target:

1. the time it adds at p50 and p99 (open loop, each at 50 req/s, the four targets --
   the engine directly, nginx, one gateway process, two workers -- asked in turn, from
   this process over kept-alive connections), beside each one's own p50 and p99 (on a
   loaded machine the engine's own p99 can exceed a proxy's, and the difference is
   negative: the p99 are each run's, not a hop's);
2. req/s, closed loop: ``wrk`` with one thread and ``--connections``, ``--rounds`` runs
   each (the order rotated each round); the median and every run, and the CPU time a
   request cost the target's processes;
3. a stream of 2,000 events: the time added per event;
4. the cold start: from the command to the first answer (a chat completion, 200);
5. the RSS of each process (the gateway's parent and each worker).

With ``--before DIR`` (a checkout of the code before a change, e.g. ``git worktree add
DIR main``), one gateway process of that code is a fifth target, measured interleaved
with the others: a change's before and after under the same load.

Asserts nothing. Goals: one gateway process carries >= 0.35 of nginx's req/s and adds
<= 2x nginx's p50, chat and stream alike; two workers near twice one (on a machine with
two idle cores: the load generator and the engine share these).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import webproc  # noqa: E402
from bench.gateway import BODY, ROOT, Target, cpu_seconds, pct, rss_mb, wait_http  # noqa: E402

EVENTS = 2000
NGINX = """worker_processes 1;
daemon off;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {folder}/body;
  proxy_temp_path {folder}/proxy;
  fastcgi_temp_path {folder}/fastcgi;
  uwsgi_temp_path {folder}/uwsgi;
  scgi_temp_path {folder}/scgi;
  upstream engine {{ server 127.0.0.1:{engine}; keepalive 128; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://engine;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }}
  }}
}}
"""
SERVING = re.compile(r"^gateway serving on \S+ \(pid (\d+)(?:; \d+ workers: ([\d, ]+))?\)$", re.M)


@dataclass
class Hop:
    """One target: its name, port, key, processes and figures."""

    name: str
    port: int
    key: str | None
    proc: subprocess.Popen[bytes] | None = None
    pids: list[int] = field(default_factory=list)  # every process that serves (workers)
    parent: int | None = None
    cold: float = 0.0
    latencies: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)
    streams: list[float] = field(default_factory=list)

    def target(self, body: dict | None = None) -> Target:
        return Target(self.port, self.key, body or BODY)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


async def first_answer(target: Target, started: float, limit: float = 120) -> float:
    """Seconds from ``started`` to the first 200 answer ``target`` gives."""
    while time.perf_counter() - started < limit:
        try:
            await target.call()
            return time.perf_counter() - started
        except (OSError, AssertionError):
            target.idle.clear()
            await asyncio.sleep(0.005)
    raise SystemExit(f"no answer on port {target.port} within {limit} s")


async def start_gateway(
    env: dict[str, str], hop: Hop, workers: int, folder: Path, root: Path = ROOT
) -> None:
    out = folder / f"{hop.name}.out"
    started = time.perf_counter()
    with out.open("wb") as o, (folder / f"{hop.name}.err").open("wb") as e:
        hop.proc = subprocess.Popen(
            [sys.executable, "manage.py", "gateway", "serve", "--port", str(hop.port),
             "--workers", str(workers)], cwd=root, env=env, stdout=o, stderr=e,
        )  # fmt: skip
    hop.cold = await first_answer(hop.target(), started)
    while not (found := SERVING.search(out.read_text())):
        await asyncio.sleep(0.05)
    hop.parent = int(found.group(1))
    hop.pids = [int(p) for p in found.group(2).split(", ")] if found.group(2) else [hop.parent]


async def start_nginx(engine: int, hop: Hop, folder: Path) -> None:
    conf = folder / "nginx.conf"
    conf.write_text(NGINX.format(folder=folder, engine=engine, port=hop.port))
    started = time.perf_counter()
    hop.proc = subprocess.Popen(["nginx", "-p", str(folder), "-c", str(conf)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    hop.cold = await first_answer(hop.target(), started)
    hop.parent = hop.proc.pid
    hop.pids = children(hop.proc.pid)


def wrk_script(folder: Path, hop: Hop) -> Path:
    import json

    script = folder / f"{hop.name}.lua"
    auth = f'wrk.headers["Authorization"] = "Bearer {hop.key}"\n' if hop.key else ""
    script.write_text(
        'wrk.method = "POST"\n'
        f"wrk.body = {json.dumps(json.dumps(BODY))}\n"
        'wrk.headers["Content-Type"] = "application/json"\n' + auth
    )
    return script


def wrk(hop: Hop, script: Path, connections: int, seconds: float) -> float:
    """req/s by wrk, closed loop; every answer must be a 200."""
    done = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{seconds:g}s", "-s", str(script),
         f"http://127.0.0.1:{hop.port}/v1/chat/completions"],
        capture_output=True, text=True, timeout=seconds + 60,
    )  # fmt: skip
    if "Non-2xx" in done.stdout or "Socket errors" in done.stdout:
        raise SystemExit(f"{hop.name}: wrk saw failures:\n{done.stdout}")
    found = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if not found:
        raise SystemExit(f"{hop.name}: wrk said:\n{done.stdout}{done.stderr}")
    return float(found.group(1))


def cpu(hop: Hop) -> float:
    """CPU seconds the target's processes have used, each once: one gateway process is
    both its parent and its only worker."""
    pids = {*hop.pids, *([hop.parent] if hop.parent else [])}
    return sum(cpu_seconds(pid) for pid in pids if Path(f"/proc/{pid}").exists())


async def latency_phase(hops: list[Hop], per_target: int, rate: float) -> None:
    """Every target at ``rate`` req/s, asked in turn, open loop."""
    targets = [h.target() for h in hops]
    for t in targets:
        for _ in range(200):
            await t.call()
    tasks = []
    start = time.perf_counter()
    total = rate * len(hops)

    async def one(i: int) -> None:
        hops[i].latencies.append(await targets[i].call() * 1000)

    for n in range(per_target * len(hops)):
        delay = start + n / total - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(n % len(hops))))
    await asyncio.gather(*tasks)


async def stream_phase(hops: list[Hop], runs: int) -> None:
    body = {**BODY, "stream": True, "max_tokens": EVENTS}
    targets = [h.target(body) for h in hops]
    for _ in range(runs):
        for hop, t in zip(hops, targets, strict=True):
            hop.streams.append(await t.call())


async def measure(args: argparse.Namespace) -> None:
    from cluster.models import Replica
    from gateway import services as keys
    from guard import services as guard_services
    from tests.catalog.samples import store

    for tool in ("nginx", "wrk"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed: apt-get install -y nginx-light wrk")
    folder = Path(tempfile.mkdtemp(prefix="llmgw-bench-hop-"))
    folder.chmod(0o755)  # nginx's worker (nobody) writes its temporary files there
    old, name = webproc.throwaway_database("llmgw_bench_hop")
    hops: list[Hop] = []
    engine_proc = None
    try:
        engine_port = webproc.free_port()
        engine_proc = subprocess.Popen([sys.executable, "bench/mockengine.py", str(engine_port)],
                                       cwd=ROOT, stdout=subprocess.DEVNULL)  # fmt: skip
        store({"name": "bench", "source": "sim/bench", "scaling": {"min": 1, "max": 1},
               "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}]})  # fmt: skip
        Replica.objects.create(model_name="bench", state="ready", profile="sim",
                               endpoint=f"http://127.0.0.1:{engine_port}")  # fmt: skip
        guard_services.set_policy({"directions": []}, surface="cli")
        _, secret = keys.create_key("bench")
        env = dict(os.environ, LLMGW_DATABASE_URL=webproc.database_url(name),
                   DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
                   LLMGW_DATA_DIR=str(folder / "data"))  # fmt: skip
        env.pop("LLMGW_REDIS_URL", None)
        wait_http(f"http://127.0.0.1:{engine_port}/")

        direct = Hop("engine", engine_port, None, pids=[engine_proc.pid])
        nginx = Hop("nginx", webproc.free_port(), None)
        one = Hop("gateway x1", webproc.free_port(), secret)
        two = Hop("gateway x2", webproc.free_port(), secret)
        hops = [direct, nginx, one, two]
        await start_nginx(engine_port, nginx, folder)
        await start_gateway(env, one, 1, folder)
        await start_gateway(env, two, 2, folder)
        if args.before:
            before = Hop("before x1", webproc.free_port(), secret)
            hops.append(before)
            await start_gateway(env, before, 1, folder, Path(args.before).resolve())
        proxies = hops[1:]
        print(f"machine: {os.cpu_count()} cores; load average before: "
              f"{' '.join(Path('/proc/loadavg').read_text().split()[:3])}")  # fmt: skip

        await latency_phase(hops, int(args.seconds * 50), 50)
        scripts = {h.name: wrk_script(folder, h) for h in hops}
        for r in range(args.rounds):
            order = hops[r % len(hops) :] + hops[: r % len(hops)]
            for hop in order:
                before = cpu(hop)
                rate = wrk(hop, scripts[hop.name], args.connections, args.seconds)
                hop.rates.append(rate)
                hop.cpu_us.append((cpu(hop) - before) / (rate * args.seconds) * 1e6)
        await stream_phase(hops, args.streams)
        print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")

        d50, d99 = pct(direct.latencies, 50), pct(direct.latencies, 99)
        dstream = statistics.median(direct.streams)
        print(f"\nthe engine directly: p50 {d50:.3f} ms, p99 {d99:.3f} ms; "
              f"{statistics.median(direct.rates):.0f} req/s; a {EVENTS}-event stream "
              f"{dstream * 1000:.2f} ms")  # fmt: skip
        print(f"{'':12} {'added p50':>10} {'added p99':>10} {'p50, p99 (ms)':>14} {'req/s':>8} "
              f"{'CPU/req':>8} {'per event':>10} {'cold start':>10}  RSS (MB)")  # fmt: skip
        for hop in proxies:
            rss = ", ".join(f"{rss_mb(p):.0f}" for p in hop.pids)
            if hop.parent and hop.parent not in hop.pids:
                rss = f"parent {rss_mb(hop.parent):.0f}; workers {rss}"
            per_event = (statistics.median(hop.streams) - dstream) / EVENTS * 1e6
            own = f"{pct(hop.latencies, 50):.3f}, {pct(hop.latencies, 99):.3f}"
            print(f"{hop.name:12} {pct(hop.latencies, 50) - d50:>7.3f} ms {pct(hop.latencies, 99) - d99:>7.3f} ms "
                  f"{own:>14} {statistics.median(hop.rates):>8.0f} {statistics.median(hop.cpu_us):>5.0f} us "
                  f"{per_event:>7.2f} us {hop.cold:>8.2f} s  {rss}")  # fmt: skip
        for hop in proxies:
            print(f"{hop.name} req/s each round: {', '.join(f'{r:.0f}' for r in hop.rates)}")
        added = {h.name: pct(h.latencies, 50) - d50 for h in proxies}
        rate = {h.name: statistics.median(h.rates) for h in proxies}
        print(f"\none gateway process / nginx, req/s: {rate['gateway x1'] / rate['nginx']:.3f} "
              f"(goal >= 0.35); added p50: {added['gateway x1'] / added['nginx']:.1f}x "
              f"nginx's (goal <= 2x)")  # fmt: skip
        print(f"two workers / one, req/s: {rate['gateway x2'] / rate['gateway x1']:.2f}")
        if "before x1" in rate:
            print(f"the code before, one process / nginx, req/s: "
                  f"{rate['before x1'] / rate['nginx']:.3f}; added p50: "
                  f"{added['before x1'] / added['nginx']:.1f}x nginx's")  # fmt: skip
    finally:
        for hop in hops:
            if hop.proc is not None and hop.proc.poll() is None:
                hop.proc.terminate()
                try:
                    hop.proc.wait(40)
                except subprocess.TimeoutExpired:
                    hop.proc.kill()
        if engine_proc is not None:
            engine_proc.terminate()
        webproc.drop_database(old)
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--before", help="a checkout of the code before: its gateway beside")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
