"""The README's first start: `manage.py init` then `manage.py serve`, as run.py runs them.

The embedded default (no database or Redis URL: SQLite in a fresh data folder), with
nothing of the tests' configuration: the simulated nodes run in the web process, the
demo catalog is there, and within a minute the replicas are ready and the sim judge
answers a guard check. The local agent is left out (LLMGW_LOCAL_AGENT=false): it would
try to fetch the real judge's weights, which is not what this test is about.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings

from catalog import rules
from cluster import plan
from llmgw_admin import demo
from tests.e2e.conftest import ROOT, free_port, wait_for

pytestmark = pytest.mark.e2e

# The README promises a minute; on a loaded 2-core machine it can take longer, so the test
# waits for each step up to a bound no healthy start reaches (tests never time things).
BOUND = 300.0


def first_start_env(tmp: Path) -> dict[str, str]:
    """Return the environment of a new user's shell: no LLMGW_* set but the data folder."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("LLMGW_") and k != "DJANGO_SETTINGS_MODULE"
    }
    env.update(
        LLMGW_DATA_DIR=str(tmp / "var"),
        LLMGW_LOCAL_AGENT="false",
        # Engines inherit it: found and killed at the end, whatever happened.
        LLMGW_E2E_RUN=str(tmp),
    )
    return env


def marked(tmp: Path) -> list[int]:
    """Return the processes started for this test (the web process and its engines)."""
    marker = f"LLMGW_E2E_RUN={tmp}".encode()
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError, ValueError):
            if marker in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
    return pids


@pytest.fixture
def first_start(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Run init and serve on a fresh data folder; yield the URL, init's output and serve."""
    env = first_start_env(tmp_path)
    init = subprocess.run(
        [sys.executable, "manage.py", "init"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")  # noqa: SIM115
    serve = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--port", str(port)],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield {
            "url": f"http://127.0.0.1:{port}",
            "init": init.stdout,
            "serve": serve,
            "started": time.monotonic(),
            "tmp": tmp_path,
        }
    finally:
        if serve.poll() is None:
            serve.terminate()
            try:
                serve.wait(timeout=40)
            except subprocess.TimeoutExpired:
                serve.kill()
        for pid in marked(tmp_path):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def sign_in(url: str, init_output: str) -> httpx.Client:
    """Sign in as the first admin with the password init printed, as a new user does."""
    password = re.search(r"password: (\S+)", init_output)
    assert password, init_output
    client = httpx.Client(base_url=url, timeout=10)
    wait_for(lambda: _answers(client), BOUND, "the web process to answer")
    client.get("/login/")
    r = client.post(
        "/login/",
        data={
            "username": "admin",
            "password": password.group(1),
            "csrfmiddlewaretoken": client.cookies["csrftoken"],
        },
        headers={"Referer": f"{url}/login/"},
    )
    assert r.status_code == 302, r.text
    client.headers["X-CSRFToken"] = client.cookies["csrftoken"]
    client.headers["Referer"] = f"{url}/"
    return client


def _answers(client: httpx.Client) -> bool:
    try:
        return client.get("/login/").status_code == 200
    except httpx.HTTPError:
        return False


def chat_wanted() -> int:
    """Return how many demo-chat replicas its schedule wants now (the control zone is UTC)."""
    classes = demo.gpu_classes(demo.parse_simulate(settings.SIMULATE_EMBEDDED))
    chat = next(m for m in demo.demo_models(classes) if m.name == demo.CHAT)
    return plan.wanted(rules.normalize(chat), datetime.now(UTC)).count


def test_first_start_shows_a_simulated_cluster(first_start: dict[str, Any]) -> None:
    out = first_start["init"]
    assert "demo models demo-chat, demo-coder, qwen3guard-0.6b-sim added" in out, out
    assert "the guard asks qwen3guard-0.6b then qwen3guard-0.6b-sim" in out, out
    deadline = first_start["started"] + BOUND
    client = sign_in(first_start["url"], out)

    def left() -> float:
        return max(0.0, deadline - time.monotonic())

    # The simulated nodes joined through the agent protocol, with their simulated cards.
    def nodes() -> dict[str, Any]:
        rows = client.get("/api/v1/cluster/nodes/").json()["results"]
        ready = {n["name"]: n for n in rows if n["health"] == "ready"}
        return ready if set(ready) == {"sim-1", "sim-2"} else {}

    by_name = wait_for(nodes, left(), "sim-1 and sim-2 ready")
    for node in by_name.values():
        assert node["simulated"] is True
        assert sorted(c["gpu_class"] for c in node["cards"]) == [
            "nvidia-h100-80gb", "nvidia-l4-24gb", "nvidia-l4-24gb",
        ]  # fmt: skip

    # The on-demand model is asked for, as the gateway would.
    r = client.post("/api/v1/cluster/models/demo-coder/demand/")
    assert r.status_code == 202, r.text

    seen: dict[str, set[str]] = {}

    def replicas() -> dict[str, list[dict[str, Any]]]:
        rows = client.get("/api/v1/cluster/replicas/", params={"desired": "true"}).json()
        out: dict[str, list[dict[str, Any]]] = {}
        for r in rows["results"]:
            out.setdefault(r["model_name"], []).append(r)
            seen.setdefault(r["model_name"], set()).add(r["state"])
        return out

    def demo_ready() -> dict[str, list[dict[str, Any]]]:
        now = replicas()
        ready = {m: [r for r in rs if r["state"] == "ready"] for m, rs in now.items()}
        ok = (
            len(ready.get(demo.CHAT, [])) == chat_wanted()
            and len(ready.get(demo.ON_DEMAND, [])) == 1
            and len(ready.get(demo.SIM_JUDGE, [])) == 1
        )
        return now if ok else {}

    now = wait_for(demo_ready, left(), "the demo models' replicas ready")
    # Placed on the simulated classes the catalog names, on the simulated nodes.
    for model, gpu_class in (
        (demo.CHAT, "nvidia-l4-24gb"),
        (demo.ON_DEMAND, "nvidia-h100-80gb"),
        (demo.SIM_JUDGE, "nvidia-h100-80gb"),
    ):
        for replica in now[model]:
            (a,) = replica["assignments"]
            node = by_name[a["node"]]
            assert [c["gpu_class"] for c in node["cards"] if c["index"] in a["cards"]] == [
                gpu_class
            ]
    # The sim engine takes a few seconds to load: the console saw the replica loading.
    assert "loading" in seen[demo.ON_DEMAND], seen
    # The real judge cannot run here (no local agent, no llama-server): unplaced.
    assert [r["state"] for r in now["qwen3guard-0.6b"]] == ["pending"]

    # A guard check: the real judge first has no replica, so the sim judge decides.
    r = client.post("/api/v1/guard/check", json={"request": "tell me UNSAFE-MARKER"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["judge"], body["verdict"], body["decision"]) == (
        demo.SIM_JUDGE, "unsafe", "refuse",
    )  # fmt: skip
    assert [(f["judge"], f["kind"]) for f in body["failures"]] == [
        ("qwen3guard-0.6b", "no_replica")
    ]
    body = client.post("/api/v1/guard/check", json={"request": "How do I list files?"}).json()
    assert (body["judge"], body["verdict"], body["decision"]) == (demo.SIM_JUDGE, "safe", "allow")

    # Every page says the cluster is simulated.
    page = client.get("/catalog/")
    assert page.status_code == 200
    banner = re.search(r'<div id="simulated-banner".*?</div>', page.text, re.S)
    assert banner, page.text[:2000]
    text = " ".join(re.sub(r"<[^>]+>", " ", banner.group(0)).split())
    assert "Simulated cluster: nodes sim-1, sim-2 run simulated cards" in text, text
    assert "LLMGW_SIMULATE=off" in text

    # One command started everything, so stopping it stops everything: no engine is left.
    serve = first_start["serve"]
    serve.send_signal(signal.SIGINT)
    serve.wait(timeout=40)
    wait_for(lambda: not marked(first_start["tmp"]), 20, "every sim engine to stop")


def test_simulate_off_adds_no_demo_and_a_bad_value_stops_the_start(tmp_path: Path) -> None:
    env = dict(first_start_env(tmp_path), LLMGW_SIMULATE="off")
    init = subprocess.run(
        [sys.executable, "manage.py", "init"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert init.returncode == 0, init.stderr
    assert "demo" not in init.stdout
    env["LLMGW_SIMULATE"] = "2x nvidia-h100"
    bad = subprocess.run(
        [sys.executable, "manage.py", "serve", "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0
    assert 'LLMGW_SIMULATE: node 1 ("2x nvidia-h100"): "nvidia-h100" is not a GPU class' in (
        bad.stderr
    ), bad.stderr[-2000:]


def test_run_py_stopped_by_sigterm_stops_the_web_process_and_its_engines(tmp_path: Path) -> None:
    """A service manager or ``kill`` stops run.py alone: the web process it started, and
    the simulated nodes' engines, stop with it, and nothing holds the port."""
    env = first_start_env(tmp_path)
    port = free_port()
    env["LLMGW_PORT"] = str(port)
    log = (tmp_path / "run.log").open("wb")  # noqa: SIM115
    starter = subprocess.Popen(
        [sys.executable, "run.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10)
        wait_for(lambda: _answers(client), BOUND, "the web process to answer")
        # run.py, the web process and at least one engine of the demo's replicas.
        wait_for(
            lambda: len([p for p in marked(tmp_path) if p != starter.pid]) >= 2,
            BOUND,
            "an engine of the simulated nodes started",
        )
        starter.send_signal(signal.SIGTERM)
        starter.wait(timeout=BOUND)
        wait_for(lambda: not marked(tmp_path), 60, "every process run.py started to end")
        assert not _answers(client)
    finally:
        if starter.poll() is None:
            starter.kill()
        for pid in marked(tmp_path):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        log.close()
