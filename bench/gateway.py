"""Measure what the gateway adds to a request, and how much one gateway process carries.

    .venv/bin/python bench/gateway.py [--requests 100000] [--seconds 5]

On a throwaway PostgreSQL database: a fast mock engine (bench/mockengine.py, its own
process) holds a ready replica of model ``bench``; one ``manage.py gateway serve``
process routes to it with a real client key. The load generator is this process: raw
HTTP/1.1 over kept-alive connections (httptools parsing), so its own cost is the same for
both targets and cancels out. Phases, each printing its figures:

1. latency at 100 req/s, open loop, requests to the engine directly and through the
   gateway interleaved one for one: p50 and p99 of each and the difference;
2. the most requests a second each carries, closed loop with 64 connections; then the
   same request as Anthropic's Messages and OpenAI's Responses, sent natively to the
   engine's own routes (model ``bench``: the mock answers them as vLLM does, the gateway
   checks the request and normalizes the answer) and translated to its chat completions
   (model ``bench-chat``, on the same engine, which ``LLMGW_GATEWAY_TRANSLATE_DIALECTS``
   names): latency at 100 req/s against the engine directly, and the most a second;
3. a stream of 2,000 events, directly and through the gateway: the time per event added;
4. memory: the gateway's RSS before and after ``--requests`` requests;
5. the guard on requests: a sim judge (no artificial latency) judging every request, at
   100 req/s again, against phase 1's gateway figure;
6. with ``--litellm PATH`` (the ``litellm`` command of a LiteLLM proxy installed apart,
   e.g. ``python3 -m venv /tmp/ll && /tmp/ll/bin/pip install 'litellm[proxy]'``): the same
   latency and closed-loop phases through LiteLLM's proxy (two workers, no database, a
   master key, the local cost map) in front of the same mock engine;
7. with ``--redis URL``: the gateway reaches Redis there, as in production (budgets and
   the state the gateway processes share: gateway/shared.py, its pass every quarter
   second), for every phase above; and a lower band's room taken in Redis
   (``Shared.take``, what such a request pays while its model is under pressure), timed
   here: its p50 and p99. Without it, the gateway runs alone (no Redis).

Asserts nothing. Goals: overhead p50 <= 1 ms and p99 <= 5 ms at 100 req/s,
<= 50 us a streamed event, RSS flat, >= 2,500 req/s through one process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
# The setup (a throwaway database, the model, the key, the policy) runs between the
# load generator's phases, on its loop: a benchmark, not a server.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

import django  # noqa: E402

django.setup()

import httptools  # noqa: E402
import httpx  # noqa: E402

from bench import webproc  # noqa: E402

BODY = {"model": "bench", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}
# The same request in the other dialects, natively (model bench) and translated to the
# engine's chat completions (model bench-chat), not stored: the store's write is off the
# request path, and not what is measured.
DIALECTS = {
    f"{dialect} {way}": (path, {**body, "model": model})
    for way, model in (("native", "bench"), ("translated", "bench-chat"))
    for dialect, path, body in (
        ("messages", "/v1/messages",
         {"max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}),
        ("responses", "/v1/responses", {"max_output_tokens": 10, "input": "hi", "store": False}),
    )
}  # fmt: skip


class _Answer:
    def __init__(self) -> None:
        self.done = asyncio.get_running_loop().create_future()
        self.status = 0
        self.size = 0
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self.size += len(body)

    def on_message_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if not self.done.done():
            self.done.set_result(None)


class Conn(asyncio.Protocol):
    """One kept-alive connection: a request at a time."""

    def __init__(self) -> None:
        self.answer: _Answer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.answer is not None:
            self.answer.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.answer is not None and not self.answer.done.done():
            self.answer.done.set_exception(ConnectionError("closed"))

    async def send(self, message: bytes) -> tuple[int, int]:
        self.answer = _Answer()
        self.transport.write(message)
        await self.answer.done
        return self.answer.status, self.answer.size


class Target:
    def __init__(
        self, port: int, key: str | None, body: dict, path: str = "/v1/chat/completions"
    ) -> None:
        self.port = port
        payload = json.dumps(body).encode()
        auth = f"Authorization: Bearer {key}\r\n" if key else ""
        self.message = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode() + payload
        self.idle: list[Conn] = []

    async def conn(self) -> Conn:
        if self.idle:
            return self.idle.pop()
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(Conn, "127.0.0.1", self.port)
        return conn

    async def call(self) -> float:
        conn = await self.conn()
        start = time.perf_counter()
        status, _ = await conn.send(self.message)
        took = time.perf_counter() - start
        if status != 200:
            raise AssertionError(f"status {status}")
        self.idle.append(conn)
        return took


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


async def open_loop(direct: Target, gateway: Target, rate: float, n: int) -> tuple[list, list]:
    """``n`` requests to each, interleaved, one every 1/rate s; latencies in ms."""
    d: list[float] = []
    g: list[float] = []
    tasks = []
    start = time.perf_counter()

    async def one(target: Target, into: list[float]) -> None:
        into.append(await target.call() * 1000)

    for i in range(2 * n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(direct, d) if i % 2 == 0 else one(gateway, g)))
    await asyncio.gather(*tasks)
    return d, g


async def closed_loop(target: Target, connections: int, seconds: float) -> float:
    count = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal count
        while time.perf_counter() < stop:
            await target.call()
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return count / (time.perf_counter() - start)


def cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_http(url: str) -> None:
    for _ in range(300):
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not answer")


def start_gateway(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    log = Path(f"/tmp/llmgw-bench-gateway-{port}.log").open("w")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "gateway", "serve", "--port", str(port), "--workers", "1"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/v1/models")
    return proc


async def measure(args: argparse.Namespace) -> None:
    from cluster.models import Replica
    from gateway import services as keys
    from guard import services as guard_services
    from tests.catalog.samples import store
    from tests.guard.helpers import guard_model
    from tests.guard.test_client import launch, stop

    old, name = webproc.throwaway_database("llmgw_bench_gateway")
    procs: list[subprocess.Popen] = []
    try:
        engine_port = webproc.free_port()
        procs.append(subprocess.Popen([sys.executable, "bench/mockengine.py", str(engine_port)],
                                      cwd=ROOT, stdout=subprocess.DEVNULL))  # fmt: skip
        store({"name": "bench", "source": "sim/bench", "scaling": {"min": 1, "max": 1},
               "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}]})  # fmt: skip
        for model in ("bench", "bench-chat"):
            if model != "bench":
                store({"name": model, "source": f"sim/{model}", "scaling": {"min": 1, "max": 1},
                       "profiles": [{"name": "sim", "engine": "sim",
                                     "gpu_class": "nvidia-h100-80gb"}]})  # fmt: skip
            Replica.objects.create(model_name=model, state="ready", profile="sim",
                                   endpoint=f"http://127.0.0.1:{engine_port}")  # fmt: skip
        guard_services.set_policy({"directions": []}, surface="cli")
        _, secret = keys.create_key("bench")
        env = dict(os.environ, LLMGW_DATABASE_URL=webproc.database_url(name),
                   DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
                   LLMGW_GATEWAY_TRANSLATE_DIALECTS="bench-chat")  # fmt: skip
        env.pop("LLMGW_REDIS_URL", None)
        if args.redis:
            env["LLMGW_REDIS_URL"] = args.redis
        port = webproc.free_port()
        gw = start_gateway(env, port)
        procs.append(gw)
        wait_http(f"http://127.0.0.1:{engine_port}/")
        direct = Target(engine_port, None, BODY)
        through = Target(port, secret, BODY)
        for _ in range(200):  # warm-up
            await direct.call()
            await through.call()

        n = int(args.seconds * 100 / 2)
        d, g = await open_loop(direct, through, 100, n)
        print(f"at 100 req/s ({n} each): direct p50 {pct(d, 50):.3f} ms p99 {pct(d, 99):.3f} ms;"
              f" gateway p50 {pct(g, 50):.3f} ms p99 {pct(g, 99):.3f} ms")  # fmt: skip
        over50 = pct(g, 50) - pct(d, 50)
        over99 = pct(g, 99) - pct(d, 99)

        max_direct = await closed_loop(direct, 64, args.seconds)
        cpu_before = cpu_seconds(gw.pid)
        max_gateway = await closed_loop(Target(port, secret, BODY), 64, args.seconds)
        cpu_per_request = (cpu_seconds(gw.pid) - cpu_before) / (max_gateway * args.seconds) * 1e6
        print(
            f"closed loop, 64 connections: direct {max_direct:.0f} req/s, "
            f"gateway {max_gateway:.0f} req/s (gateway CPU {cpu_per_request:.0f} us a request)"
        )

        # The dialects: the same request as Anthropic's Messages and OpenAI's Responses.
        dialect_figures = []
        for dialect, (path, body) in DIALECTS.items():
            spoken = Target(port, secret, body, path)
            for _ in range(200):  # warm-up
                await spoken.call()
            dd, dg = await open_loop(direct, spoken, 100, n)
            most = await closed_loop(Target(port, secret, body, path), 64, args.seconds)
            added = pct(dg, 50) - pct(dd, 50)
            dialect_figures.append(f"{dialect}: overhead p50 {added:.3f} ms "
                                   f"(chat's {over50:.3f} ms), max {most:.0f} req/s "
                                   f"(chat's {max_gateway:.0f})")  # fmt: skip
            print(f"{dialect} at 100 req/s: gateway p50 {pct(dg, 50):.3f} ms p99 "
                  f"{pct(dg, 99):.3f} ms; closed loop {most:.0f} req/s")  # fmt: skip

        events = 2000
        sbody = {**BODY, "stream": True, "max_tokens": events}
        sd, sg = Target(engine_port, None, sbody), Target(port, secret, sbody)
        td = [await sd.call() for _ in range(20)]
        tg = [await sg.call() for _ in range(20)]
        per_event = (statistics.median(tg) - statistics.median(td)) / events * 1e6
        print(
            f"stream of {events} events: direct {statistics.median(td) * 1000:.2f} ms, "
            f"gateway {statistics.median(tg) * 1000:.2f} ms"
        )

        before = rss_mb(gw.pid)
        many = Target(port, secret, BODY)
        done = 0
        marks = []
        while done < args.requests:
            batch = min(1000, args.requests - done)
            await asyncio.gather(*(many.call() for _ in range(batch)))
            done += batch
            if done % max(1, args.requests // 5) == 0:
                marks.append(f"{done}: {rss_mb(gw.pid):.1f}")
        after = rss_mb(gw.pid)
        print(f"gateway RSS before {args.requests} requests {before:.1f} MB, after {after:.1f} MB "
              f"(MB after n: {', '.join(marks)})")  # fmt: skip

        # The guard on requests: a sim judge answering at once.
        judge, judge_url = launch("--model", "judge", "--guard-format", "qwen3guard",
                                  "--ttft", "0", "--tps", "100000")  # fmt: skip
        try:
            guard_model("judge", endpoint=judge_url)
            guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"]},
                                      surface="cli")  # fmt: skip
            gw.terminate()
            gw.wait(20)
            gw = start_gateway(env, port)
            procs.append(gw)
            guarded = Target(port, secret, BODY)
            for _ in range(200):
                await guarded.call()
            judge_port = int(judge_url.rsplit(":", 1)[1])
            raw_judge = Target(
                judge_port,
                None,
                {
                    "model": "judge",
                    "max_tokens": 1,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            own = [await raw_judge.call() * 1000 for _ in range(200)]
            print(f"the judge's own answer (asked directly): p50 {pct(own, 50):.3f} ms")
            d2, g2 = await open_loop(direct, guarded, 100, n)
            guard_adds = pct(g2, 50) - pct(g, 50)
            print(
                f"guarded at 100 req/s: gateway p50 {pct(g2, 50):.3f} ms p99 {pct(g2, 99):.3f} ms"
            )
        finally:
            stop(judge)

        take = await take_phase(args.redis) if args.redis else ""

        litellm_max = None
        if args.litellm:
            litellm_max = await litellm_phase(args, engine_port, direct, n, procs)

        print(f"gateway overhead p50 at 100 req/s: {over50:.3f} ms")
        print(f"gateway overhead p99 at 100 req/s: {over99:.3f} ms")
        print(f"gateway max req/s: {max_gateway:.0f} (direct {max_direct:.0f})")
        print(f"stream overhead per event: {per_event:.1f} us")
        print(f"guard on requests adds p50: {guard_adds:.3f} ms")
        if take:
            print(take)
        for line in dialect_figures:
            print(line)
        if litellm_max:
            print(f"litellm max req/s: {litellm_max:.0f}; gateway/litellm: "
                  f"{max_gateway / litellm_max:.1f}x")  # fmt: skip
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        webproc.drop_database(old)


LITELLM_KEY = "sk-bench-0123456789abcdef0123456789"


async def take_phase(url: str) -> str:
    """A lower band's room taken in Redis, as a request does while its model is under
    pressure: 2,000 takes one after another, timed here."""
    try:
        from gateway.shared import Shared
    except ImportError:
        return "a lower band's take in Redis: none in this tree (no gateway/shared.py)"
    from django.conf import settings

    from gateway.path.admission import Admission, Counts
    from gateway.path.outliers import Outliers
    from guard.breaker import Breakers, Config

    admission = Admission(counts=Counts())
    breakers = Breakers(lambda: Config.from_settings(settings))
    shared = Shared(url, admission, Outliers(), breakers=breakers, timeout=0.25)
    shared.start()
    try:
        for _ in range(200):  # warm-up: the connection, the script loaded
            await shared.take("bench-take", 10**9, 0)
        took = []
        for _ in range(2000):
            start = time.perf_counter()
            await shared.take("bench-take", 10**9, 0)
            took.append((time.perf_counter() - start) * 1000)
    finally:
        await shared.stop()
    line = (f"a lower band's take in Redis (under pressure only): p50 {pct(took, 50):.3f} ms "
            f"p99 {pct(took, 99):.3f} ms")  # fmt: skip
    print(line)
    return line


async def litellm_phase(
    args: argparse.Namespace, engine_port: int, direct: Target, n: int, procs: list
) -> float:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="llmgw-bench-litellm-"))
    config = folder / "config.yaml"
    config.write_text(
        "model_list:\n  - model_name: bench\n    litellm_params:\n      model: openai/bench\n"
        f"      api_base: http://127.0.0.1:{engine_port}/v1\n      api_key: x\n"
        f"general_settings:\n  master_key: {LITELLM_KEY}\n"
    )
    port = webproc.free_port()
    env = dict(os.environ, LITELLM_LOCAL_MODEL_COST_MAP="True")
    proc = subprocess.Popen(
        [args.litellm, "--config", str(config), "--port", str(port), "--num_workers", "2"],
        cwd=folder, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    procs.append(proc)
    target = Target(port, LITELLM_KEY, BODY)
    deadline = time.monotonic() + 120
    while True:
        try:
            await target.call()
            break
        except (OSError, AssertionError):
            if time.monotonic() > deadline:
                raise SystemExit("LiteLLM's proxy did not answer in 120 s") from None
            await asyncio.sleep(1)
    for _ in range(200):
        await target.call()
    d, ll = await open_loop(direct, target, 100, n)
    print(f"litellm at 100 req/s: p50 {pct(ll, 50):.3f} ms p99 {pct(ll, 99):.3f} ms "
          f"(overhead p50 {pct(ll, 50) - pct(d, 50):.3f} ms, p99 {pct(ll, 99) - pct(d, 99):.3f} ms)")  # fmt: skip
    best = await closed_loop(Target(port, LITELLM_KEY, BODY), 64, args.seconds)
    print(f"litellm closed loop, 64 connections: {best:.0f} req/s")
    proc.terminate()
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--litellm", help="a LiteLLM proxy's `litellm` command, to compare")
    parser.add_argument("--redis", help="a Redis URL the gateway shares its state through")
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
