"""Measure the live console: from a state change to the updated element in the page.

    .venv/bin/python bench/live.py [--changes 40] [--consoles 1 100] [--workers 2]

Starts `manage.py serve --workers N` (uvicorn, N processes sharing the port by
SO_REUSEPORT) as production runs it, with the Redis channel layer, on a throwaway
PostgreSQL database. For each console count it opens that many consoles on the
dashboard's socket (/ws/live/nodes,models,judges,peers/), each signed in as a viewer of
its own, as a site's operators are (one user may hold only LLMGW_WS_PER_USER consoles in
a process): one is a real headless Chromium page showing /cluster/, the others are
websocket clients in this process (opened a few at a time; the kernel spreads them over
the workers). Then it cordons and uncordons a node through the REST API, one change at a
time, and times, for every console, from just before the API call to:

- in Chromium: the node's state badge in the page showing the new state (a
  MutationObserver stamps the time the swapped element lands in the DOM);
- in the websocket clients: the frame carrying the node's new fragment arriving (all of
  them read by this one process, on the same machine: its own work is in the figures).

Prints p50/p95 per console count (all consoles' times together, and the browser's
alone), the machine's load average, the CPU the web processes used over the changes
(a change's cost, which a loaded machine's other work does not add to), and the CPU this
process used meanwhile, reading the websocket clients (the clients' side of the figure);
asserts nothing. Goal: p95 under 250 ms with
1,000 consoles on two web processes (`--consoles 1000 --workers 2`). The last line reads
`live p95 with N consoles: <ms> ms`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

import httpx  # noqa: E402

logging.getLogger("httpx").setLevel(logging.WARNING)
import websockets  # noqa: E402
from django.db import connection  # noqa: E402

from bench import webproc  # noqa: E402

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]  # fmt: skip

# Stamps, in the page, when the node's state badge shows a new state (wall clock, ms).
OBSERVER = """
(nodeId) => {
  window.__seen = [];
  const record = () => {
    const badge = document.querySelector('#' + nodeId + ' [data-role=node-state]');
    if (badge) window.__seen.push([badge.textContent.trim(), Date.now()]);
  };
  new MutationObserver(record).observe(document.body, {childList: true, subtree: true});
}
"""


# Changes made first and not counted: the first renders warm the process's caches.
WARMUP = 4
# Consoles being opened at once.
OPENING = 20
# Consoles opened again after a 1013 before their snapshot, and closed while listening.
RETRIES = [0]
CLOSED = [0]
# The web process's pid (its workers are its children), for the CPU its workers use.
WEB: list[int] = []


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered)) - 1))]


async def ws_console(url: str, cookie: str, origin: str, node_dom: str, arrivals: list) -> Any:
    """Open one console's socket; record (state, time) of every frame about the node.

    A console the server closes with 1013 before its snapshot arrived (not ready in time
    on a loaded machine) is opened again, as the page's htmx extension does; each retry
    is counted in ``RETRIES``. One closed later stops listening: its updates are missing
    from the count of those seen.
    """
    for attempt in range(5):
        # A loaded machine answers a thousand handshakes slowly: wait up to a minute for
        # each, and leave keeping the socket alive to the server's own heartbeat.
        ws = await websockets.connect(
            url, additional_headers={"Cookie": cookie, "Origin": origin}, max_size=2**24,
            open_timeout=60, ping_interval=None,
        )  # fmt: skip
        try:
            await ws.recv()  # the snapshot
            break
        except websockets.ConnectionClosed:
            RETRIES[0] += 1
            if attempt == 4:
                raise
            await asyncio.sleep(1 + attempt)

    async def listen() -> None:
        try:
            async for frame in ws:
                at = time.time()
                if f'id="{node_dom}"' in frame:
                    state = "cordoned" if 'node-state">cordoned<' in frame else "ready"
                    arrivals.append((state, at))
        except websockets.ConnectionClosed:
            CLOSED[0] += 1

    return ws, asyncio.get_running_loop().create_task(listen())


async def run_round(
    base: str,
    cookies: list[str],
    token: str,
    node: Any,
    consoles: int,
    changes: int,
    browser: Any,
) -> tuple[list[float], list[float]]:
    ws_url = base.replace("http", "ws") + "/ws/live/nodes,models,judges,peers/"
    node_dom = f"cluster-node-{node.pk}"
    # The browser is one console; the rest are websocket clients.
    page = await browser.new_page()
    await page.context.add_cookies(
        [{"name": "sessionid", "value": cookies[0].split("=", 1)[1], "url": base}]
    )
    await page.goto(base + "/cluster/")
    await page.wait_for_selector("[data-live-status].on")
    await page.evaluate(OBSERVER, node_dom)
    arrivals: list[list] = [[] for _ in range(consoles - 1)]
    opening = asyncio.Semaphore(OPENING)

    async def open_one(i: int) -> Any:
        async with opening:
            return await ws_console(ws_url, cookies[1 + i], base, node_dom, arrivals[i])

    t = time.monotonic()
    clients = await asyncio.gather(*(open_one(i) for i in range(consoles - 1)))
    print(f"{consoles} console(s) open in {time.monotonic() - t:.1f} s")
    all_ms: list[float] = []
    browser_ms: list[float] = []
    cpu_at = None
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Token {token}"}) as api:
        for i in range(-WARMUP, changes):
            if i == 0:
                cpu_at = (webproc.cpu_seconds(WEB[0]), time.monotonic(), time.process_time())
                load_at = os.getloadavg()[0]
            want = "cordoned" if i % 2 == 0 else "ready"
            action = "cordon" if want == "cordoned" else "uncordon"
            seen_before = [len(a) for a in arrivals]
            page_before = await page.evaluate("window.__seen.length")
            t0 = time.time()
            r = await api.post(f"/api/v1/cluster/nodes/{node.name}/{action}/")
            r.raise_for_status()
            deadline = time.time() + 10
            while time.time() < deadline:
                got_ws = all(
                    any(s == want for s, _ in a[n:])
                    for a, n in zip(arrivals, seen_before, strict=True)
                )
                seen = await page.evaluate("window.__seen")
                got_page = any(s == want for s, _ in seen[page_before:])
                if got_ws and got_page:
                    break
                await asyncio.sleep(0.02)
            if i < 0:
                await asyncio.sleep(0.3)
                continue  # warming up: not counted
            for a, n in zip(arrivals, seen_before, strict=True):
                at = next((t for s, t in a[n:] if s == want), None)
                if at is not None:
                    all_ms.append((at - t0) * 1000)
            at_ms = next((t for s, t in seen[page_before:] if s == want), None)
            if at_ms is not None:
                browser_ms.append(at_ms - t0 * 1000)
                all_ms.append(at_ms - t0 * 1000)
            await asyncio.sleep(0.3)
    cpu_s, took = webproc.cpu_seconds(WEB[0]) - cpu_at[0], time.monotonic() - cpu_at[1]
    read_s = time.process_time() - cpu_at[2]
    print(
        f"{consoles} console(s): the web processes used {cpu_s:.1f} CPU s over the {changes} "
        f"changes ({took:.0f} s, load average {load_at:.1f} to {os.getloadavg()[0]:.1f}; "
        f"heartbeats and the API's calls included): {cpu_s / changes * 1000:.0f} ms a change, "
        f"{cpu_s / changes / consoles * 1e6:.0f} us a console; this process, reading the "
        f"{consoles - 1} websocket clients (and driving the API and the page), used "
        f"{read_s:.1f} CPU s: {read_s / changes * 1000:.0f} ms a change"
    )
    for ws, task in clients:
        task.cancel()
        await ws.close()
    await page.close()
    return all_ms, browser_ms


async def measure(
    base: str, cookies: list[str], token: str, node: Any, counts: list[int], changes: int
) -> dict:
    from playwright.async_api import async_playwright

    results = {}
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True
        )
        context = await browser.new_context()
        for n in counts:
            results[n] = await run_round(base, cookies, token, node, n, changes, context)
            results[n] += (os.getloadavg()[0],)
        await browser.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--consoles", type=int, nargs="+", default=[1, 100])
    parser.add_argument(
        "--workers", type=int, default=2, help="web processes (manage.py serve --workers)"
    )
    args = parser.parse_args()
    try:
        import playwright  # noqa: F401
    except ModuleNotFoundError:
        sys.exit(
            "bench/live.py drives Chromium with Playwright, one of the test tools: install them "
            "with `.venv/bin/pip install -r requirements-dev.txt` (`python3 run.py test` does), "
            "and Chromium with `apt-get install chromium`"
        )

    old_name, db_name = webproc.throwaway_database("llmgw_bench_live")

    from django.contrib.auth.models import Group, User
    from django.contrib.sessions.backends.db import SessionStore

    from cluster import agentjoin
    from cluster.models import JoinToken
    from llmgw_core.models import ApiToken

    # A viewer of its own for each console, each signed in (no password: made for the
    # bench, they sign in by the session alone).
    viewers = []
    for i in range(max(args.consoles)):
        viewer = User(username=f"bench-viewer-{i:04d}")
        viewer.set_unusable_password()
        viewers.append(viewer)
    viewers = User.objects.bulk_create(viewers)
    viewer_group = Group.objects.get_or_create(name="viewer")[0]
    User.groups.through.objects.bulk_create(
        [User.groups.through(user_id=v.pk, group_id=viewer_group.pk) for v in viewers]
    )
    operator = User.objects.create_user("bench-operator", password="x")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    cookies = []
    for viewer in viewers:
        session = SessionStore()
        session["_auth_user_id"] = str(viewer.pk)
        session["_auth_user_backend"] = "django.contrib.auth.backends.ModelBackend"
        session["_auth_user_hash"] = viewer.get_session_auth_hash()
        session.create()
        cookies.append(f"sessionid={session.session_key}")
    _, token = ApiToken.issue(operator, "bench")
    _, secret = JoinToken.issue("bench")
    inventory = {
        "hostname": "bench-node", "cpu_cores": 64, "memory_mb": 512_000,
        "disk_free_mb": 2_000_000, "engines": {"sim": "1"}, "labels": {}, "weights": [],
        "simulated": True,
        "cards": [{"index": k, "class": "nvidia-h100-80gb", "memory_mb": 81559,
                   "power_limit_w": 700} for k in range(8)],
    }  # fmt: skip
    node, _ = agentjoin.join(secret, "bench-node", inventory)
    # A cluster of some size, so a render is not trivially small.
    for i in range(20):
        _, s = JoinToken.issue(f"bench-{i}")
        agentjoin.join(s, f"bench-{i:02d}", {**inventory, "hostname": f"bench-{i:02d}"})
    connection.close()

    port = webproc.free_port()
    redis = os.environ.get("LLMGW_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
    env = dict(
        os.environ,
        DJANGO_SETTINGS_MODULE="llmgw_admin.settings",
        LLMGW_DATABASE_URL=webproc.database_url(db_name),
        LLMGW_SECRET_KEY="test-only-not-secret", LLMGW_DATA_DIR=f"/tmp/llmgw-bench-live-{port}",
        LLMGW_NODE_LOST_AFTER="3600", LLMGW_LOCAL_AGENT="false", LLMGW_SIMULATE="off",
        LLMGW_REDIS_URL=redis, LLMGW_ALLOWED_HOSTS="127.0.0.1,localhost",
    )  # fmt: skip
    web = webproc.start(env, port, "live", args.workers)
    WEB.append(web.pid)
    base = f"http://127.0.0.1:{port}"
    try:
        results = asyncio.run(measure(base, cookies, token, node, args.consoles, args.changes))
    finally:
        webproc.stop(web)
        webproc.drop_database(old_name)
    last = None
    print(
        f"{args.workers} web process(es); machine: {os.cpu_count()} cores; consoles opened "
        f"again after a 1013 before their snapshot: {RETRIES[0]}; closed while listening: "
        f"{CLOSED[0]}"
    )
    for n, (all_ms, browser_ms, load) in results.items():
        expected = n * args.changes
        print(
            f"{n} console(s), {args.changes} changes: {len(all_ms)} of {expected} updates seen "
            f"(load average {load:.1f} at the end); "
            f"p50 {statistics.median(all_ms):.0f} ms, p95 {pct(all_ms, 95):.0f} ms, "
            f"max {max(all_ms):.0f} ms"
        )
        print(
            f"  in Chromium's page: p50 {statistics.median(browser_ms):.0f} ms, "
            f"p95 {pct(browser_ms, 95):.0f} ms"
        )
        last = (n, pct(all_ms, 95))
    if last:
        print(f"live p95 with {last[0]} consoles: {last[1]:.0f} ms")


if __name__ == "__main__":
    main()
