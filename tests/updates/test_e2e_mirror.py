"""The mirror end to end: a real control plane process (``manage.py serve``), real agents,
the Hub stand-in as the registry: a real llama-server loads SmolLM2 from the mirror, and
four simulated nodes needing one model cause one fetch from the registry."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster.models import Assignment, Node
from tests.catalog.samples import sim_model, store
from tests.e2e import conftest as e2e
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_cluster_e2e import _model_file, ready
from tests.llama import llama_server_binary
from tests.updates.hubstandin import HubStandIn

pytestmark = pytest.mark.e2e

# The e2e suite's agents (its conftest is not this folder's).
agents = e2e.agents

L4 = "nvidia-l4-24gb"


@pytest.fixture
def stand_in() -> Iterator[HubStandIn]:
    with HubStandIn() as hub:
        yield hub


@pytest.fixture
def control_plane(
    transactional_db: Any, tmp_path: Path, stand_in: HubStandIn
) -> Iterator[ControlPlane]:
    """The web process with the stand-in as its registry (embedded: a fetch runs in a
    thread of the web process)."""
    cp = ControlPlane(
        tmp_path,
        extra={
            "HF_ENDPOINT": stand_in.url,
            "LLMGW_MIRROR_HOSTS": stand_in.url,
            "LLMGW_MIRROR_DIR": str(tmp_path / "mirror"),
        },
    )
    cp.start()
    yield cp
    cp.stop()


def _origin(name: str) -> Any:
    from catalog.services import stored_specs

    return stored_specs(names=[name])[0].origin


@pytest.mark.llama_server
def test_llama_server_loads_smollm2_from_the_mirror(
    control_plane: ControlPlane, agents: Callable[..., Agent], stand_in: HubStandIn, tmp_path: Path
) -> None:
    binary = llama_server_binary()
    gguf = _model_file()
    repo = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
    commit = stand_in.commit(repo, {gguf.name: gguf, "README.md": b"# SmolLM2"})
    # The node may take weights from nowhere but the control plane: no weights host, no
    # folder holding the model.
    agent = agents("cpu-1", "--llama-server", binary, "--weights-hosts", "",
                   "--stop-engines-on-exit")  # fmt: skip
    wait_for(lambda: Node.objects.filter(name="cpu-1", health="ready").exists(), 60, "the node")
    store({
        "name": "smol", "source": repo, "context_length": 2048, "max_output": 64,
        "profiles": [{"name": "cpu", "engine": "llamacpp", "cpu_cores": 2,
                      "args": ["--ctx-size", "2048"]}],
        "scaling": {"min": 1, "max": 1},
    })  # fmt: skip
    wait_for(ready("smol"), 300, "llama-server ready on the mirrored GGUF")
    # The registry was read once, by the mirror: the node took the file from it.
    assert stand_in.count("GET", f"/{repo}/resolve/") == 2  # the GGUF and the README, once
    held = agent.state_dir / "weights" / "mirror" / "hf" / "HuggingFaceTB"
    [local] = list(held.rglob(gguf.name))
    assert local.stat().st_size == gguf.stat().st_size
    origin = _origin("smol")
    assert origin.repo == repo and origin.revision == commit
    assert [f.path for f in origin.files] == [gguf.name]


def test_four_simulated_nodes_needing_one_model_cause_one_fetch(
    control_plane: ControlPlane, agents: Callable[..., Agent], stand_in: HubStandIn
) -> None:
    weights = {"llmgw-sim-weights": 1, "name": "v1", "arithmetic": 1.0}
    repo = "org/sim-chat"
    commit = stand_in.commit(
        repo,
        {"sim-weights.json": json.dumps(weights).encode(), "model.safetensors": b"w" * 300_000},
    )
    for i in range(4):
        agents(f"sim-{i}", "--simulate", f"1x {L4}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").count() == 4, 90, "four nodes")
    # A model with an origin runs from its files: each sim node takes them from the mirror.
    store(sim_model("chat", 4, gpu_class=L4, source=repo,
                    origin={"repo": repo, "revision": commit}))  # fmt: skip
    wait_for(ready("chat", 4), 180, "four replicas ready")
    nodes = set(
        Assignment.objects.filter(replica__model_name="chat").values_list("node__name", flat=True)
    )
    assert len(nodes) == 4
    assert stand_in.count("GET", f"/{repo}/resolve/") == 2  # each file once, for four nodes
    assert stand_in.count("GET", f"/api/models/{repo}") == 1
    from updates.models import Fetch

    assert Fetch.objects.filter(model="chat").count() == 1
