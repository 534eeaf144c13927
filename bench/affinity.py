"""Session affinity: agents' sessions sharing one long system prompt, on a few replicas.

    .venv/bin/python bench/affinity.py [--sessions 64] [--turns 8] [--replicas 4]

Four sim engines (``python -m agent.sim``, each its own process with its own prefix cache)
are the ready replicas of model ``chat``; the real gateway (``gateway.path.app.Gateway`` under
uvicorn, its table built in memory as its state builds it from the database) routes to
them. ``--sessions`` sessions run at once, each ``--turns`` turns one after another,
every turn resending the whole conversation: one 6 KB system prompt shared by all the
sessions, then the session's own turns. A session names itself one of three ways in turn:
the ``x-session-id`` header, ``prompt_cache_key`` (chat completions), Anthropic's
``metadata.user_id`` (``/v1/messages``). Each session has a client key of its own (one
owner for all), so the gateway's record of each request says whose it was and which
replica answered.

Printed, for session affinity and then for the same turns naming no session (prefix
affinity alone, over the conversation's leading text, which is the shared prompt):

- the share of turns on the session's replica (a turn after the first on the replica its
  previous turn had);
- busiest over least busy replica, by turns served;
- the share of prompt tokens the engines had cached (their usage).

Goals: at least 95 % of turns on the session's replica, busiest over least busy <= 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
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

SYSTEM = ("You are a careful coding agent working in a large repository. " * 100)[:6144]
WAYS = ("x-session-id", "prompt_cache_key", "metadata.user_id")


class NoGuard:
    """A policy that judges nothing: this measures routing."""

    def directions(self) -> tuple[bool, bool]:
        return False, False

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        raise AssertionError("nothing is judged")


class Heard(Observer):
    def __init__(self) -> None:
        super().__init__()
        self.turns: list[tuple[str, int | None, int]] = []

    def request(self, done: Done) -> None:
        super().request(done)
        self.turns.append((done.key, done.replica, done.status))


def launch_sims(n: int) -> tuple[list[subprocess.Popen[str]], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", "0",
             "--model", "chat", "--ttft", "0.02", "--tps", "2000"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert proc.stdout is not None
        found = re.search(r"listening on (http://\S+)", proc.stdout.readline())
        if not found:
            raise SystemExit("a sim engine did not start")
        procs.append(proc)
        urls.append(found.group(1))
    return procs, urls


def secret(session: int) -> str:
    return f"llmgw-ck-bench-affinity-{session:04d}"


async def one_session(client: httpx.AsyncClient, url: str, session: int, turns: int,
                      named: bool, cached: list[int]) -> None:  # fmt: skip
    way = WAYS[session % len(WAYS)]
    history: list[dict[str, str]] = []
    sid = f"session-{session:04d}"
    for turn in range(turns):
        history.append({"role": "user", "content": f"Session {session}, step {turn}: go on."})
        headers = {"Authorization": f"Bearer {secret(session)}"}
        if way == "metadata.user_id":
            body: dict[str, Any] = {"model": "chat", "max_tokens": 8, "system": SYSTEM,
                                    "messages": history}  # fmt: skip
            if named:
                body["metadata"] = {"user_id": sid}
            r = await client.post(url + "/v1/messages", json=body, headers=headers)
            r.raise_for_status()
            answer = r.json()
            text = "".join(b.get("text", "") for b in answer["content"])
            usage = answer["usage"]
            cached[0] += usage.get("cache_read_input_tokens", 0)
            cached[1] += usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
        else:
            body = {"model": "chat", "max_tokens": 8,
                    "messages": [{"role": "system", "content": SYSTEM}, *history]}  # fmt: skip
            if named and way == "prompt_cache_key":
                body["prompt_cache_key"] = sid
            elif named:
                headers["x-session-id"] = sid
            r = await client.post(url + "/v1/chat/completions", json=body, headers=headers)
            r.raise_for_status()
            answer = r.json()
            text = answer["choices"][0]["message"]["content"] or ""
            usage = answer["usage"]
            cached[0] += (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            cached[1] += usage.get("prompt_tokens", 0)
        history.append({"role": "assistant", "content": text})


async def run(urls: list[str], sessions: int, turns: int, named: bool) -> dict[str, float]:
    keys = {digest(secret(s)): Key(s + 1, f"s{s}", "bench", (), None) for s in range(sessions)}
    model = spec.Model(name="chat", source="sim/chat", scaling=spec.Scaling(min=1, max=4))
    rows = [ReplicaRow(i + 1, "chat", "sim", url) for i, url in enumerate(urls)]
    state = State(loader=lambda: build([model], rows, keys, {}), interval=1.0,
                  record_demand=lambda name: None)  # fmt: skip
    heard = Heard()
    gateway = Gateway(state=state, guard=NoGuard(), observer=heard,  # type: ignore[arg-type]
                      options=Options(first_byte_timeout=30, read_timeout=30))  # fmt: skip
    # Kept-alive connections outlive the client's pauses (no close raced by a reuse).
    server = uvicorn.Server(uvicorn.Config(gateway, host="127.0.0.1", port=0, lifespan="off",
                                           log_level="warning", access_log=False,
                                           timeout_keep_alive=120))  # fmt: skip
    serving = asyncio.ensure_future(server.serve())
    while not (server.started and server.servers):
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cached = [0, 0]
    started = time.perf_counter()
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(one_session(client, url, s, turns, named, cached)
                               for s in range(sessions)))  # fmt: skip
    took = time.perf_counter() - started
    server.should_exit = True
    await serving
    state.stop()
    by_session: dict[str, list[int]] = {}
    for key, replica, status in heard.turns:
        assert status == 200 and replica is not None, (key, replica, status)
        by_session.setdefault(key, []).append(replica)
    kept = sum(1 for rs in by_session.values() for a, b in zip(rs, rs[1:], strict=False) if a == b)
    later = sum(len(rs) - 1 for rs in by_session.values())
    served = Counter(r for rs in by_session.values() for r in rs)
    counts = [served.get(i + 1, 0) for i in range(len(urls))]
    return {
        "kept": kept / later if later else 1.0,
        "skew": max(counts) / max(1, min(counts)),
        "counts": counts,  # type: ignore[dict-item]
        "cached": cached[0] / cached[1] if cached[1] else 0.0,
        "seconds": took,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=64)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    procs, urls = launch_sims(args.replicas)
    try:
        print(f"{args.sessions} sessions x {args.turns} turns, one {len(SYSTEM)}-byte system "
              f"prompt shared, {args.replicas} sim replicas")  # fmt: skip
        for named, what in ((True, "session affinity"), (False, "no session named (prefix)")):
            got = asyncio.run(run(urls, args.sessions, args.turns, named))
            print(f"{what:28}  turns on the session's replica {100 * got['kept']:5.1f} %  "
                  f"busiest/least busy {got['skew']:5.2f} (turns per replica "
                  f"{got['counts']})  prompt tokens cached {100 * got['cached']:5.1f} %  "
                  f"{got['seconds']:.1f} s")  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
