"""The supervisor, with real engine processes: the sim engine and tiny stand-ins."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent import state
from agent.engines import AGENT_ROOT
from agent.supervisor import CRASH_LOOP_RESTARTS, Supervisor, backoff_s
from tests.waiting import wait_until

# About 28 s for the file's 27 tests in a full run (load 2 to 10): listed with the
# long files, so that it starts early rather than end the run alone (tests/conftest.py).
pytestmark = pytest.mark.takes(1.1)

# Stands in for an engine: serves /health 200 on --port at once, and on request
# ignores SIGTERM or exits with a code after a line of output.
STUB = f"""#!{sys.executable}
import http.server, os, signal, sys
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
if os.environ.get("LLMGW_SIM_STUB_IGNORE_TERM"):
    signal.signal(signal.SIGTERM, lambda *_: print("ignoring SIGTERM", flush=True))
if os.environ.get("LLMGW_SIM_STUB_EXIT"):
    print(os.environ.get("LLMGW_SIM_STUB_SAY", "bye"), flush=True)
    sys.exit(int(os.environ["LLMGW_SIM_STUB_EXIT"]))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
print("stub serving on", port, flush=True)
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


class Recorder:
    """Collect the supervisor's reports."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []

    def __call__(self, report: dict[str, Any]) -> None:
        self.reports.append(report)

    def states(self, rid: int) -> list[str]:
        """Return a replica's states in order, repeats folded."""
        out: list[str] = []
        for r in self.reports:
            if r["replica"] == rid and (not out or out[-1] != r["state"]):
                out.append(r["state"])
        return out

    def last(self, rid: int) -> dict[str, Any]:
        return [r for r in self.reports if r["replica"] == rid][-1]


@pytest.fixture
def stub(tmp_path: Path) -> str:
    path = tmp_path / "stub-engine"
    path.write_text(STUB)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., tuple[Supervisor, Recorder]]]:
    made: list[Supervisor] = []

    def make_supervisor(**kwargs: Any) -> tuple[Supervisor, Recorder]:
        recorder = Recorder()
        kwargs.setdefault("grace_s", 2.0)
        kwargs.setdefault("weights_folders", [tmp_path])  # the tests' model files are here
        sup = Supervisor(tmp_path / "state", report=recorder, **kwargs)
        made.append(sup)
        return sup, recorder

    yield make_supervisor
    # Whatever a test left running is stopped, so no engine outlives the tests.
    for sup in made:
        sup.stop_all(timeout_s=5)
    for rec in state.load_engines(tmp_path / "state").values():
        if rec.get("pid"):
            _kill(rec["pid"])


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def wait_for(sup: Supervisor, check: Callable[[], bool], timeout: float = 20.0) -> None:
    """Tick the supervisor until the check passes; fail with its states if it never does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sup.tick()
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"condition not met; states: {sup.states()}")


def state_of(sup: Supervisor, rid: int) -> str | None:
    return sup.states().get(rid, {}).get("state")


def sim(rid: int = 1, generation: int = 1, **over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "id": rid,
        "generation": generation,
        "model": "chat",
        "engine": "sim",
        "source": "sim://chat",
        "served_name": "chat",
        "args": ["--load-time", "0.5"],
        "env": {},
        "cards": [],
        "startup_timeout_s": 60,
    }
    spec.update(over)
    if spec["engine"] != "sim" and "args" not in over:
        spec["args"] = []  # --load-time is the simulator's
    return spec


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return status not in ("Z", "X")


def health(port: int) -> int:
    return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code


def test_sim_engine_goes_from_pending_through_loading_to_ready(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim(args=["--load-time", "1"])])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    assert rec.states(1) == ["pending", "starting", "loading", "ready"]
    ready = rec.last(1)
    assert ready["generation"] == 1 and ready["restarts"] == 0 and ready["progress"] is None
    assert health(ready["port"]) == 200
    assert alive(ready["pid"])
    # The engine's output goes to its log in the state folder.
    assert "llmgw-sim" in state.log_path(sup.state_dir, 1).read_text()
    assert state.load_engines(sup.state_dir)[1]["pid"] == ready["pid"]


def test_startup_timeout_fails_with_the_reason_and_stops_the_engine(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim(args=["--load-time", "60"], startup_timeout_s=1)])
    wait_for(sup, lambda: sup.states()[1]["pid"] is not None)
    pid = sup.states()[1]["pid"]
    wait_for(sup, lambda: state_of(sup, 1) == "failed")
    assert "not ready within the startup timeout of 1 s" in rec.last(1)["reason"]
    wait_for(sup, lambda: not alive(pid))
    # Failed for good at this generation: not started again.
    for _ in range(20):
        sup.tick()
    assert state_of(sup, 1) == "failed"
    assert [r for r in rec.reports if r["state"] == "starting"] == [
        r for r in rec.reports if r["state"] == "starting" and r["pid"] == pid
    ]
    # Still failed when the control plane sends the same list again …
    sup.converge([sim(args=["--load-time", "60"], startup_timeout_s=1)])
    sup.tick()
    assert state_of(sup, 1) == "failed"
    # … and started again at the next generation.
    sup.converge([sim(generation=2)])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    assert rec.last(1)["generation"] == 2


def test_killed_engine_restarted_after_a_back_off_with_the_reason(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim()])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    first = rec.last(1)
    os.kill(first["pid"], signal.SIGKILL)
    wait_for(sup, lambda: state_of(sup, 1) == "failed")
    failed = rec.last(1)
    assert failed["reason"] == "killed by signal 9 (SIGKILL); restarting in 1 s"
    assert failed["restarts"] == 1
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    again = rec.last(1)
    assert again["pid"] != first["pid"] and again["restarts"] == 1
    # Same port, while it is free: routes to the replica stay right.
    assert again["port"] == first["port"]
    assert rec.states(1)[-4:] == ["failed", "starting", "loading", "ready"]


def test_back_off_grows_to_a_minute() -> None:
    assert [backoff_s(n) for n in range(1, 10)] == [1, 2, 4, 8, 16, 32, 60, 60, 60]


def test_crash_loop_shown_as_such(make: Any, stub: str) -> None:
    sup, rec = make(binaries={"python": stub}, backoff_cap_s=0.05)
    spec = sim(env={"LLMGW_SIM_STUB_EXIT": "3", "LLMGW_SIM_STUB_SAY": "CUDA error: out of memory"})
    sup.converge([spec])
    wait_for(sup, lambda: sup.states()[1]["restarts"] >= CRASH_LOOP_RESTARTS)
    failures = [r["reason"] for r in rec.reports if r["state"] == "failed"]
    assert failures[0] == "exited with code 3: CUDA error: out of memory; restarting in 0.05 s"
    assert failures[CRASH_LOOP_RESTARTS - 1] == (
        f"crash loop: {CRASH_LOOP_RESTARTS} restarts in 10 min; last exited with code 3: "
        "CUDA error: out of memory; restarting in 0.05 s"
    )


def test_removed_replica_stopped_with_sigterm(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim()])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    pid = rec.last(1)["pid"]
    sup.converge([])
    wait_for(sup, lambda: 1 not in sup.states())
    assert rec.states(1)[-2:] == ["stopping", "stopped"]
    stopped = rec.last(1)
    assert stopped["reason"] == "no longer desired on this node"
    assert stopped["pid"] is None and stopped["port"] is None
    assert not alive(pid)
    assert state.load_engines(sup.state_dir) == {}


def test_engine_ignoring_sigterm_is_killed_after_the_grace_period(make: Any, stub: str) -> None:
    sup, rec = make(binaries={"python": stub}, grace_s=0.5)
    sup.converge([sim(env={"LLMGW_SIM_STUB_IGNORE_TERM": "1"})])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    pid = rec.last(1)["pid"]
    sup.converge([])
    wait_for(sup, lambda: 1 not in sup.states())
    assert not alive(pid)
    assert "ignoring SIGTERM" in state.log_path(sup.state_dir, 1).read_text()
    assert rec.states(1)[-2:] == ["stopping", "stopped"]


def test_new_generation_restarts_the_engine(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim()])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    old = rec.last(1)["pid"]
    sup.converge([sim(generation=2)])
    wait_for(sup, lambda: state_of(sup, 1) == "ready" and sup.states()[1]["generation"] == 2)
    assert not alive(old)
    assert rec.last(1)["pid"] != old
    stopping = [r for r in rec.reports if r["state"] == "stopping"]
    assert stopping[0]["reason"].startswith("generation 1 → 2")
    # A list older than what runs changes nothing.
    sup.converge([sim(generation=1)])
    sup.tick()
    assert sup.states()[1]["generation"] == 2


def test_restarted_supervisor_adopts_running_engines_and_never_starts_them_twice(make: Any) -> None:
    sup, _ = make()
    sup.converge([sim(1), sim(2)])
    wait_for(sup, lambda: state_of(sup, 1) == state_of(sup, 2) == "ready")
    pids = {rid: s["pid"] for rid, s in sup.states().items()}
    # The agent goes away; its engines do not.
    sup.close()
    assert all(alive(pid) for pid in pids.values())
    # One engine dies while no agent watches.
    os.kill(pids[2], signal.SIGKILL)
    wait_until(lambda: not alive(pids[2]), what="the killed engine to be gone")

    again, rec = make()
    assert rec.states(1) == ["loading"]
    assert "found running after the agent restarted" in rec.last(1)["reason"]
    assert rec.states(2) == ["pending"]
    assert "was not running when the agent restarted" in rec.last(2)["reason"]
    wait_for(again, lambda: state_of(again, 1) == state_of(again, 2) == "ready")
    now = {rid: s["pid"] for rid, s in again.states().items()}
    assert now[1] == pids[1]
    assert now[2] != pids[2]
    # The desired list arrives: nothing more is started.
    again.converge([sim(1), sim(2)])
    for _ in range(10):
        again.tick()
    assert {rid: s["pid"] for rid, s in again.states().items()} == now
    assert [r for r in rec.reports if r["state"] == "starting"] == [
        r for r in rec.reports if r["state"] == "starting" and r["replica"] == 2
    ]
    # An adopted engine is stopped like any other.
    again.converge([sim(2)])
    wait_for(again, lambda: 1 not in again.states())
    assert not alive(pids[1])


def test_record_of_a_reused_pid_is_not_adopted(make: Any, tmp_path: Path) -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        state.save_engines(
            tmp_path / "state",
            {
                1: {
                    "replica": 1,
                    "pid": sleeper.pid,
                    "start_ticks": 1,  # not when this process started
                    "argv": ["vllm", "serve"],
                    "port": 1,
                    "desired": sim(),
                }
            },
        )
        sup, rec = make()
        assert rec.states(1) == ["pending"]
        wait_for(sup, lambda: state_of(sup, 1) == "ready")
        assert sup.states()[1]["pid"] != sleeper.pid
        # Someone else's process is left alone.
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_simulated_cards_run_only_sim_engines(make: Any) -> None:
    sup, rec = make(simulated=True)
    sup.converge(
        [sim(1, cards=[0]), sim(2, engine="vllm", cards=[1]), sim(3, engine="llamacpp", cards=[])]
    )
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    assert rec.last(2)["state"] == "failed"
    assert "simulated" in rec.last(2)["reason"] and '"vllm"' in rec.last(2)["reason"]
    # A CPU replica runs for real on a simulated node (here: no llama-server to run).
    assert "simulated" not in rec.last(3)["reason"]


def test_engine_not_installed_refused(make: Any) -> None:
    sup, rec = make(engines={"sim": "1"})
    sup.converge([sim(engine="vllm", source="org/m")])
    assert rec.last(1)["state"] == "failed"
    assert rec.last(1)["reason"] == 'engine "vllm" is not installed on this node (installed: sim)'
    # Removed from the list, it is gone.
    sup.converge([])
    wait_for(sup, lambda: not sup.states())
    assert rec.last(1)["state"] == "stopped"


def test_command_refused_fails_with_the_reason(make: Any, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"gguf")
    sup, rec = make()
    sup.converge([sim(engine="llamacpp", source=str(model), nodes=2)])
    wait_for(sup, lambda: state_of(sup, 1) == "failed")
    assert "does not span nodes" in rec.last(1)["reason"]


def test_missing_program_fails_with_the_reason(make: Any, tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"gguf")
    sup, rec = make(binaries={"llama-server": str(tmp_path / "no-such-llama-server")})
    sup.converge([sim(engine="llamacpp", source=str(model))])
    wait_for(sup, lambda: state_of(sup, 1) == "failed")
    assert rec.last(1)["reason"].startswith("could not start")


def test_weights_downloaded_with_progress_before_the_engine_starts(
    make: Any, stub: str, tmp_path: Path
) -> None:
    content = os.urandom(3 * 1024 * 1024)

    class Origin(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            for i in range(0, len(content), 512 * 1024):
                self.wfile.write(content[i : i + 512 * 1024])
                time.sleep(0.15)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Origin)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/m/small.gguf"
        sup, rec = make(
            binaries={"llama-server": stub},
            weights_dir=tmp_path / "w",
            weights_hosts=[f"http://127.0.0.1:{server.server_address[1]}"],
        )
        sup.converge(
            [sim(engine="llamacpp", source=url, sha256=hashlib.sha256(content).hexdigest())]
        )
        wait_for(sup, lambda: state_of(sup, 1) == "ready")
    finally:
        server.shutdown()
        server.server_close()
    downloading = [r for r in rec.reports if r["reason"].startswith("downloading weights")]
    assert downloading and all(r["state"] == "loading" for r in downloading)
    fractions = [r["progress"] for r in downloading]
    assert fractions == sorted(fractions) and 0 < fractions[0] < 1 and fractions[-1] == 1
    assert rec.states(1)[:3] == ["pending", "loading", "starting"]
    assert rec.states(1)[-1] == "ready"
    argv = json.loads(json.dumps(state.load_engines(sup.state_dir)[1]["argv"]))
    assert argv[argv.index("-m") + 1].startswith(str(tmp_path / "w"))


def test_failed_download_retried(make: Any, tmp_path: Path) -> None:
    sup, rec = make(backoff_cap_s=0.05, weights_hosts=["http://127.0.0.1:9"])
    sup.converge([sim(engine="llamacpp", source="http://127.0.0.1:9/m.gguf")])
    wait_for(sup, lambda: len([r for r in rec.reports if r["state"] == "failed"]) >= 2)
    first = next(r for r in rec.reports if r["state"] == "failed")
    assert "downloading http://127.0.0.1:9/m.gguf failed" in first["reason"]
    assert first["reason"].startswith("downloading the weights failed; retrying in 0.05 s")
    assert "fetching the weights again" in [r["reason"] for r in rec.reports]


def test_background_thread_ticks(make: Any) -> None:
    sup, _ = make(poll_interval_s=0.05)
    sup.start()
    sup.converge([sim()])
    # Only the supervisor's own thread ticks here.
    wait_until(lambda: state_of(sup, 1) == "ready", timeout=20, what="replica 1 to be ready")


def test_engine_started_but_never_recorded_is_found_by_its_command_line(
    make: Any, tmp_path: Path
) -> None:
    # The agent died between starting the engine and recording its pid: the record it
    # wrote first holds the command line.
    port = _free()
    argv = [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--model", "chat"]
    engine = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONPATH": AGENT_ROOT},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        state.save_engines(
            tmp_path / "state",
            {1: {"replica": 1, "pid": None, "argv": argv, "port": port, "desired": sim()}},
        )
        sup, rec = make()
        wait_for(sup, lambda: state_of(sup, 1) == "ready")
        assert sup.states()[1]["pid"] == engine.pid
        assert "starting" not in rec.states(1)
    finally:
        engine.kill()
        engine.wait()


def _free() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_rank_waits_for_its_leaders_address(make: Any, stub: str) -> None:
    sup, rec = make(binaries={"vllm": stub})
    rank1 = sim(engine="vllm", source="org/m", nodes=2, rank=1, leader="gpu-07", cards=[0])
    sup.converge([rank1])
    wait_for(sup, lambda: "waiting for rank 0" in sup.states()[1]["reason"])
    for _ in range(5):
        sup.tick()
    assert state_of(sup, 1) == "pending"
    # The next list names the leader's port: the rank starts, headless, ready once running.
    sup.converge([{**rank1, "leader": "gpu-07:8100"}])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    argv = state.load_engines(sup.state_dir)[1]["argv"]
    assert argv[argv.index("--master-port") + 1] == "8102"
    assert "--headless" in argv


# -- engine keys -------------------------------------------------------------------------

KEY = "llmgw_engine_supervisor-test-key"


def chat_status(port: int, key: str | None) -> int:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    return httpx.post(url, json=body, headers=headers, timeout=10).status_code


def test_engine_started_with_its_key_refuses_whoever_lacks_it(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim(engine_key=KEY)])
    # Ready: the agent's own health check passes, key or not.
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    ready = rec.last(1)
    assert ready["reason"] == "the engine answers /health"
    assert chat_status(ready["port"], None) == 401
    assert chat_status(ready["port"], "llmgw_engine_wrong") == 401
    assert chat_status(ready["port"], KEY) == 200
    # Not on the process's command line (ps), nor in the engine's log's command line.
    cmdline = Path(f"/proc/{ready['pid']}/cmdline").read_bytes()
    assert KEY.encode() not in cmdline
    assert KEY not in state.log_path(sup.state_dir, 1).read_text()
    # The record that holds it is the agent's user's alone.
    assert (sup.state_dir / state.ENGINES_FILE).stat().st_mode & 0o077 == 0
    assert state.log_path(sup.state_dir, 1).stat().st_mode & 0o077 == 0


def test_a_changed_engine_key_restarts_the_engine_with_the_new_one(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim(engine_key=KEY)])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    old = rec.last(1)["pid"]
    sup.converge([sim(engine_key=KEY + "-new")])
    wait_for(sup, lambda: state_of(sup, 1) == "ready" and sup.states()[1]["pid"] != old)
    assert not alive(old)
    stopping = [r for r in rec.reports if r["state"] == "stopping"]
    assert stopping[-1]["reason"] == "its engine key changed: restarting it with the new one"
    port = rec.last(1)["port"]
    assert chat_status(port, KEY) == 401
    assert chat_status(port, KEY + "-new") == 200
    assert all(KEY not in r["reason"] for r in rec.reports)


def test_an_engine_from_before_keys_keeps_serving_and_says_its_port_is_open(make: Any) -> None:
    # Started by an agent (or for a control plane) from before engine keys: no key.
    sup, _ = make()
    sup.converge([sim()])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    pid = sup.states()[1]["pid"]
    sup.close()
    # The upgraded agent adopts it, and its desired list now names a key.
    again, rec = make()
    again.converge([sim(engine_key=KEY)])
    wait_for(again, lambda: state_of(again, 1) == "ready")
    assert again.states()[1]["pid"] == pid  # not restarted: it keeps serving
    assert "answers any caller until the replica is restarted" in rec.last(1)["reason"]
    port = rec.last(1)["port"]
    assert chat_status(port, KEY) == 200  # the gateway's key is ignored, not refused
    # An operator's restart (a new generation) starts it with its key.
    again.converge([sim(generation=2, engine_key=KEY)])
    wait_for(again, lambda: state_of(again, 1) == "ready" and again.states()[1]["pid"] != pid)
    assert rec.last(1)["reason"] == "the engine answers /health"
    assert chat_status(rec.last(1)["port"], None) == 401


def test_an_engine_key_in_an_engines_output_is_not_reported(make: Any, stub: str) -> None:
    sup, rec = make(binaries={"python": stub}, backoff_cap_s=0.05)
    say = f"server_args=ServerArgs(api_key='{KEY}', port=1)"
    sup.converge([sim(engine_key=KEY, env={"LLMGW_SIM_STUB_EXIT": "1", "LLMGW_SIM_STUB_SAY": say})])
    wait_for(sup, lambda: state_of(sup, 1) == "failed")
    reason = rec.last(1)["reason"]
    assert "api_key='[engine key]'" in reason
    assert KEY not in reason


def test_a_crashed_engines_last_lines_are_reported_with_every_secret_masked(
    make: Any, tmp_path: Path
) -> None:
    node_token = "llmgw_node_" + "n" * 40
    crash = tmp_path / "crashing-engine"
    crash.write_text(
        f"#!{sys.executable}\nimport sys\nprint('line one', flush=True)\n"
        f"print('CUDA error: out of memory (key {KEY}, token {node_token})', file=sys.stderr)\n"
        "sys.exit(3)\n"
    )
    crash.chmod(0o755)
    sup, rec = make(binaries={"python": str(crash)}, backoff_cap_s=60)
    sup.converge([sim(engine_key=KEY)])
    wait_for(sup, lambda: state_of(sup, 1) == "failed")
    failed = rec.last(1)
    assert failed["log"][-2:] == [
        "line one",
        "CUDA error: out of memory (key [engine key], token [secret])",
    ]
    assert failed["log"][0].startswith("--- ")  # the run's header, its command line
    assert not any(KEY in line or node_token in line for line in failed["log"])


def test_a_running_engines_new_lines_are_reported_while_it_runs(make: Any) -> None:
    sup, rec = make()
    sup.converge([sim()])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    port = rec.last(1)["port"]
    with open(state.log_path(sup.state_dir, 1), "a") as log:
        log.write("a line the engine wrote after it was ready\n")
    wait_for(sup, lambda: "a line the engine wrote after it was ready" in rec.last(1)["log"])
    assert rec.last(1)["state"] == "ready" and rec.last(1)["port"] == port


def test_an_engines_log_is_bounded_in_lines_and_length(tmp_path: Path) -> None:
    from agent.enginelog import LOG_LINE_CHARS, LOG_LINES, tail

    path = tmp_path / "engine.log"
    path.write_text("".join(f"{i} " + "x" * 100 + "\n" for i in range(5000)))
    lines = tail(path)
    assert len(lines) == LOG_LINES
    assert lines[-1].startswith("4999 ")
    path.write_text("".join(f"{i} " + "x" * 100_000 + "\n" for i in range(50)))
    lines = tail(path)
    assert lines and all(len(line) <= LOG_LINE_CHARS for line in lines)
    assert tail(tmp_path / "missing.log") == []


def test_a_ready_engine_that_stops_answering_is_reported_and_ready_again_when_it_answers(
    make: Any,
) -> None:
    """A sim engine stopped by SIGSTOP still accepts connections and answers nothing: its
    watch reports it failed (the control plane takes it out of routing), its process left
    running, and ready again once SIGCONT lets it answer."""
    sup, rec = make()
    sup.watch_every_s, sup.watch_timeout_s = 0.2, 0.5
    sup.converge([sim()])
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    pid = rec.last(1)["pid"]
    os.killpg(pid, signal.SIGSTOP)
    try:
        wait_for(sup, lambda: state_of(sup, 1) == "failed")
        hung = rec.last(1)
        assert hung["reason"].startswith(
            "not answering: its /health gave no answer within 0.5 s 3 times in a row since "
        )
        assert "out of routing while its process runs on" in hung["reason"]
        assert hung["pid"] == pid and hung["restarts"] == 0 and hung["port"]
        assert alive(pid)  # left running: not killed, not restarted
    finally:
        os.killpg(pid, signal.SIGCONT)
    wait_for(sup, lambda: state_of(sup, 1) == "ready")
    back = rec.last(1)
    assert back["reason"] == "the engine answers /health again"
    assert back["pid"] == pid and back["restarts"] == 0
    assert rec.states(1)[-3:] == ["ready", "failed", "ready"]
