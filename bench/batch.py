"""Live traffic beside a batch: each live band's TTFT p99 on a sim model with and without
a 10,000-line batch running on the same replica in the batch band.

    .venv/bin/python bench/batch.py [--lines 10000] [--rate 4] [--seconds 60]
                                    [--slo-ms 0] [--alone-runs 3] [--beside-runs 3]
                                    [--bands high,normal,low]

The proof is ``bench/batch.py --lines 10000 --seconds 60`` with ``--slo-ms 150``, with
``--slo-ms 80`` and with the default slo (about 10 to 15 minutes each on an idle machine:
five live phases and the batch's rest, run flat out once live traffic stops).

One sim engine (``python -m agent.sim``, its own process: ``--parallel`` slots, more wait
their turn, each request beside another slowing a new one by ``--slowdown``) is the ready
replica of model ``chat``, whose ``slo`` is a TTFT p99 of ``--slo-ms`` (by default 110 %
of the live p99 measured alone: the bound admission then holds the batch to). The real gateway
(``gateway.path.app.Gateway`` under uvicorn, its table built in memory as its state builds it
from the database, admission as configured) routes to it. Client keys: one live key
a band of ``--bands``, and ``nightly``, whose batch is uploaded and created with the
official ``openai`` client through the gateway's Files and Batch APIs, then run by the
batch runner in a process of its own (``gateway.batch.runner.run_next``, as a worker runs
it), ``LLMGW_BATCH_CONCURRENCY`` lines at once, each sent back through the gateway in the
``batch`` band.

Every live phase sends each band's key ``--rate`` streamed requests a second (open loop,
the bands interleaved: every band meets the same moments of the batch, none is measured
last) for ``--seconds``; a refused one (429) is counted, not timed. Phases, each printing
its figures:

1. live alone, no slo: the client's TTFT (to the first byte of text) p50 and p99; the slo
   set from it;
2. ``--alone-runs`` phases alone with the slo in force (admission acting as it will beside
   the batch);
3. ``--beside-runs`` phases beside the batch (started first, running throughout);
4. the batch to its end: its lines, its time, lines a second, and how often its lines
   were held back (429) by admission.

For each band, alone and beside: the p99 over all of that condition's phases pooled, with
the number of first tokens it is read from (a p99 of n rests on its n/100 slowest), and
each phase's own p99 (their spread is the figure's noise); then beside / alone. Asserts
nothing. Goal: the live TTFT p99 beside the batch within 10 % of its value alone, and the
batch finished within its window (24 h).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
FILES = tempfile.mkdtemp(prefix="llmgw-bench-batch-")
os.environ["LLMGW_FILES_DIR"] = FILES

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import openai  # noqa: E402
import uvicorn  # noqa: E402

from catalog import spec  # noqa: E402
from gateway.path.app import Gateway, Options  # noqa: E402
from gateway.path.table import (  # noqa: E402
    Key,
    ReplicaRow,
    build,
    digest,  # noqa: E402
)
from gateway.records.observe import Done, Observer  # noqa: E402
from gateway.records.state import State  # noqa: E402

# One live key a band, each sending in its own phases.
LIVE = {band: f"llmgw-ck-bench-batch-live-{band}" for band in ("high", "normal", "low")}
NIGHTLY = "llmgw-ck-bench-batch-nightly"
# The batch runner as a worker runs it: one batch, to its end.
RUNNER = """
import django, sys
django.setup()
from gateway.batch import runner
sys.exit(0 if runner.run_next() == 1 else 1)
"""


class NoGuard:
    """A policy that judges nothing: this measures admission."""

    def directions(self) -> tuple[bool, bool]:
        return False, False

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        raise AssertionError("nothing is judged")


class Heard(Observer):
    """Counts the batch's lines held back (429) at admission."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self.answered = 0

    def request(self, done: Done) -> None:
        super().request(done)
        if done.batch:
            if done.status == 429:
                self.held += 1
            else:
                self.answered += 1


def launch_sim(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", "0",
         "--model", "chat", "--ttft", str(args.ttft), "--tps", str(args.tps),
         "--parallel", str(args.parallel), "--slowdown", str(args.slowdown)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    found = re.search(r"listening on (http://\S+)", proc.stdout.readline())
    if not found:
        raise SystemExit("the sim engine did not start")
    return proc, found.group(1)


def serve(engine: str, slo_ms: list[int], heard: Heard) -> tuple[uvicorn.Server, State, str]:
    """The gateway on a loop of its own, in a thread (the load generator has its own);
    the model's slo is ``slo_ms[0]`` as the state last read it."""
    keys = {digest(secret): Key(n, f"live-{band}", "team:app", (), None, priority=band)
            for n, (band, secret) in enumerate(LIVE.items(), start=10)}  # fmt: skip
    keys[digest(NIGHTLY)] = Key(2, "nightly", "team:offline", (), None, priority="normal")
    rows = [ReplicaRow(1, "chat", "sim", engine)]
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def table() -> Any:
        model = spec.Model(name="chat", source="sim/chat", scaling=spec.Scaling(min=1, max=1),
                           slo=spec.SLO(ttft_p99=slo_ms[0] * 1_000_000))  # fmt: skip
        return build([model], rows, keys, {})

    state = State(loader=table, interval=1.0, record_demand=lambda name: None)
    gateway = Gateway(state=state, guard=NoGuard(), observer=heard,  # type: ignore[arg-type]
                      options=Options(first_byte_timeout=60, read_timeout=60))  # fmt: skip
    server = uvicorn.Server(uvicorn.Config(gateway, host="127.0.0.1", port=0, lifespan="off",
                                           log_level="warning", access_log=False,
                                           timeout_keep_alive=120))  # fmt: skip
    loop.call_soon_threadsafe(lambda: asyncio.ensure_future(server.serve()))
    while not (server.started and server.servers):
        time.sleep(0.01)
    state.start(loop)
    port = server.servers[0].sockets[0].getsockname()[1]
    return server, state, f"http://127.0.0.1:{port}"


class Phase:
    """One live phase's figures per band: each answered request's TTFT (ms) and how many
    were refused (429: held at admission past their wait)."""

    def __init__(self, bands: list[str]) -> None:
        self.ttfts: dict[str, list[float]] = {band: [] for band in bands}
        self.refused: dict[str, int] = dict.fromkeys(bands, 0)


async def live_load(url: str, rate: float, seconds: float, bands: list[str]) -> Phase:
    """Each band's key sends ``rate`` streamed requests a second (open loop, the bands
    interleaved) for ``seconds``."""
    phase = Phase(bands)
    body = {"model": "chat", "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "a live question"}]}  # fmt: skip
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def one(band: str) -> None:
            headers = {"Authorization": f"Bearer {LIVE[band]}"}
            start = time.perf_counter()
            async with client.stream("POST", "/v1/chat/completions", json=body,
                                     headers=headers) as r:  # fmt: skip
                if r.status_code == 429:
                    await r.aread()
                    phase.refused[band] += 1
                    return
                if r.status_code != 200:
                    raise SystemExit(f"a live {band} request was answered {r.status_code}")
                first = None
                async for line in r.aiter_lines():
                    if (
                        first is None
                        and line.startswith("data: {")
                        and any(
                            (c.get("delta") or {}).get("content")
                            for c in json.loads(line[6:]).get("choices", ())
                        )
                    ):
                        first = (time.perf_counter() - start) * 1000
                if first is None:
                    raise SystemExit("a live answer had no text")
                phase.ttfts[band].append(first)

        tasks = []
        began = time.perf_counter()
        every = 1 / (rate * len(bands))
        for i in range(int(rate * seconds) * len(bands)):
            delay = began + i * every - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(bands[i % len(bands)])))
        await asyncio.gather(*tasks)
    return phase


def pct(values: list[float], p: float) -> float:
    """The ``p`` percentile of ``values`` (nearest rank; nan with none)."""
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(p / 100 * len(values)))]


def pooled(phases: list[Phase], band: str) -> list[float]:
    return [ms for phase in phases for ms in phase.ttfts[band]]


def summary(phases: list[Phase], band: str) -> str:
    """A band's figures over ``phases``: the pooled p50 and p99 with their count, the
    refused, and each phase's own p99 (their spread)."""
    every = pooled(phases, band)
    runs = [pct(phase.ttfts[band], 99) for phase in phases]
    refused = sum(phase.refused[band] for phase in phases)
    rank = len(every) - min(len(every) - 1, int(0.99 * len(every)))  # the p99's place
    thin = "; too few for a p99, fewer than 500" if len(every) < 500 else ""
    return (f"p50 {pct(every, 50):5.0f} ms  p99 {pct(every, 99):5.0f} ms (place {rank} from "
            f"the slowest of {len(every)} first tokens{thin}), {refused} refused; each phase's p99 "
            f"{', '.join(f'{r:.0f}' for r in runs)} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000)
    parser.add_argument("--rate", type=float, default=4.0, help="live requests a second")
    parser.add_argument("--seconds", type=float, default=60.0, help="each live phase")
    parser.add_argument("--ttft", type=float, default=0.05, help="the sim's seconds to a token")
    parser.add_argument("--tps", type=float, default=400.0)
    parser.add_argument("--parallel", type=int, default=8, help="the sim's slots")
    parser.add_argument("--slowdown", type=float, default=0.05)
    parser.add_argument(
        "--slo-ms",
        type=int,
        default=0,
        help="the model's TTFT p99 slo (0: 110 %% of the live p99 alone)",
    )
    parser.add_argument("--alone-runs", type=int, default=3,
                        help="live phases without the batch, the slo in force")  # fmt: skip
    parser.add_argument("--beside-runs", type=int, default=3,
                        help="live phases beside the batch")  # fmt: skip
    parser.add_argument("--bands", default="high,normal,low",
                        help="the live keys' admission bands, sending at once")  # fmt: skip
    parser.add_argument("--concurrency", type=int, default=4,
                        help="LLMGW_BATCH_CONCURRENCY: batch lines sent at once")  # fmt: skip
    args = parser.parse_args()
    t0 = time.perf_counter()
    proc, engine = launch_sim(args)
    heard = Heard()
    slo = [60_000]  # the first phase's: none to speak of
    server, state, url = serve(engine, slo, heard)
    bands = args.bands.split(",")
    runner: subprocess.Popen[bytes] | None = None
    try:
        print(f"sim: ttft {args.ttft * 1000:.0f} ms, {args.tps:.0f} tokens/s, "
              f"{args.parallel} slots, slowdown {args.slowdown}; batch lines "
              f"{args.concurrency} at once; live {args.rate:g} req/s a band "
              f"({', '.join(bands)}, interleaved) for {args.seconds:g} s a phase; "
              f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
        asyncio.run(live_load(url, args.rate, 5, bands))  # warm: connections, the window
        first = asyncio.run(live_load(url, args.rate, args.seconds, bands))
        every = [ms for band in bands for ms in first.ttfts[band]]
        print(f"live alone, no slo: TTFT p50 {pct(every, 50):5.0f} ms  p99 "
              f"{pct(every, 99):5.0f} ms  ({len(every)} requests, "
              f"{sum(first.refused.values())} refused)")  # fmt: skip
        slo[0] = args.slo_ms or round(1.1 * pct(every, 99))
        before = state.table
        state.poke()
        while state.table is before:
            time.sleep(0.01)
        print(f"the model's slo: TTFT p99 {slo[0]} ms")
        # Without the batch, the slo in force (admission as it will be beside the batch),
        # run again and again: the spread of these is the figure's own noise.
        alone: list[Phase] = []
        for n in range(args.alone_runs):
            alone.append(asyncio.run(live_load(url, args.rate, args.seconds, bands)))
            print(f"alone, phase {n + 1} of {args.alone_runs} (load average "
                  f"{os.getloadavg()[0]:.1f})")  # fmt: skip
        for band in bands:
            print(f"{band:>6} alone:  {summary(alone, band)}")

        api = openai.OpenAI(base_url=url + "/v1", api_key=NIGHTLY, max_retries=0, timeout=120)
        rows = [{"custom_id": f"line-{n}", "method": "POST", "url": "/v1/chat/completions",
                 "body": {"model": "chat", "max_tokens": 8,
                          "messages": [{"role": "user", "content": f"classify item {n}"}]}}
                for n in range(args.lines)]  # fmt: skip
        data = "".join(json.dumps(r) + "\n" for r in rows).encode()
        uploaded = api.files.create(file=("nightly.jsonl", data), purpose="batch")
        batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                                   completion_window="24h")  # fmt: skip
        env = dict(os.environ, LLMGW_GATEWAY_URL=url,
                   LLMGW_BATCH_CONCURRENCY=str(args.concurrency))  # fmt: skip
        started = time.perf_counter()
        runner = subprocess.Popen([sys.executable, "-c", RUNNER], cwd=ROOT, env=env)
        while api.batches.retrieve(batch.id).request_counts.completed < args.concurrency:
            time.sleep(0.2)  # the batch under way before the live phase starts
        beside: list[Phase] = []
        for n in range(args.beside_runs):
            beside.append(asyncio.run(live_load(url, args.rate, args.seconds, bands)))
            b = api.batches.retrieve(batch.id)
            print(f"beside the batch, phase {n + 1} of {args.beside_runs}: "
                  f"{b.request_counts.completed} batch lines done by its end, batch "
                  f"{b.status} (load average {os.getloadavg()[0]:.1f})")  # fmt: skip
            if b.status != "in_progress":
                print("  the batch ended within this phase: part of it was alone")
        for band in bands:
            print(f"{band:>6} beside: {summary(beside, band)}")
        for band in bands:
            a, b_ = pct(pooled(alone, band), 99), pct(pooled(beside, band), 99)
            runs = [pct(phase.ttfts[band], 99) for phase in alone]
            print(f"{band:>6} band TTFT p99: alone {a:.0f} ms ({len(pooled(alone, band))}), "
                  f"beside the batch {b_:.0f} ms ({len(pooled(beside, band))}): beside / alone "
                  f"{b_ / a:.2f}; alone phases {min(runs) / a:.2f}-{max(runs) / a:.2f} "
                  "of the pooled alone")  # fmt: skip
        if runner.wait(timeout=24 * 3600) != 0:
            raise SystemExit("the batch runner failed")
        took = time.perf_counter() - started
        done = api.batches.retrieve(batch.id)
        counts = done.request_counts
        print(f"batch: {done.status}, {counts.completed} of {counts.total} lines answered "
              f"({counts.failed} failed) in {took:.0f} s ({counts.total / took:.0f} lines/s); "
              f"its lines held back by admission {heard.held} times; its window 24 h: "
              f"{'within' if done.status == 'completed' else 'NOT within'} it, "
              f"{took / (24 * 3600):.1%} of it used; whole run {time.perf_counter() - t0:.0f} s "
              f"(load average {os.getloadavg()[0]:.1f})")  # fmt: skip
    finally:
        if runner is not None and runner.poll() is None:
            runner.terminate()
            runner.wait(timeout=10)
        server.should_exit = True
        state.stop()
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
