"""A model no node can run for want of an engine says what is missing and how to get it.

The README's first start: the baseline judge (llama.cpp on CPUs) beside simulated nodes,
on a machine without llama-server. The dashboard and the judge's page must say what to
do: build llama-server with the script, where its GGUF goes on an air-gapped machine,
and that the sim judge answers meanwhile.
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from catalog.spec import Model, Profile
from cluster import reconciler
from cluster.hints import NodeEngines, engine_hints
from cluster.models import Node, Replica
from llmgw_admin import demo
from tests.cluster.helpers import join_node

BASELINE = "qwen3guard-0.6b"
GGUF = "https://huggingface.co/org/m/resolve/main/Model.Q8_0.gguf"


def cpu(engine: str = "llamacpp", source: str = GGUF) -> Model:
    return Model(name="judge", source=source, profiles=[Profile(name="cpu", engine=engine)])


def nodes(*specs: tuple[bool, bool, set[str]]) -> list[NodeEngines]:
    return [
        NodeEngines(f"n{i}", ready, sim, frozenset(e)) for i, (ready, sim, e) in enumerate(specs)
    ]


def test_a_llamacpp_model_with_no_llama_server_anywhere_says_to_build_it() -> None:
    (hint,) = engine_hints([cpu()], nodes((True, False, {"sim"})), "/data/agent/weights").values()
    assert hint.engine == "llamacpp" and "llama-server" in hint.missing
    assert any("bash scripts/build-llama-server.sh" in s for s in hint.steps)
    assert any("restart the node's agent" in s for s in hint.steps)
    (weights,) = hint.weights
    assert "Model.Q8_0.gguf" in weights and "/data/agent/weights" in weights
    assert "without internet" in weights


@pytest.mark.parametrize(
    "found",
    [
        [(True, False, {"llamacpp"})],  # a ready real node runs it: no hint
    ],
)
def test_no_hint_where_a_node_runs_the_engine(found: list[tuple[bool, bool, set[str]]]) -> None:
    assert engine_hints([cpu()], nodes(*found)) == {}


@pytest.mark.parametrize(
    "found",
    [
        [],  # no node at all
        [(False, False, {"llamacpp"})],  # only on a node that takes nothing new
        [(True, True, {"llamacpp", "sim"})],  # only on a simulated node: it runs sim only
    ],
)
def test_a_hint_where_no_ready_real_node_runs_the_engine(
    found: list[tuple[bool, bool, set[str]]],
) -> None:
    assert list(engine_hints([cpu()], nodes(*found))) == ["judge"]


def test_sim_models_and_local_weights_need_no_such_words() -> None:
    assert engine_hints([cpu(engine="sim")], nodes()) == {}
    (hint,) = engine_hints([cpu(source="/models/m.gguf")], nodes()).values()
    assert hint.weights == ()
    (hint,) = engine_hints([cpu(engine="vllm", source="org/m")], nodes()).values()
    assert "vLLM" in hint.missing and "pip install vllm" in hint.steps[0]


@pytest.fixture
def first_start(settings: Any, db: Any) -> None:
    """The README's first start: init with the simulated nodes, this machine's agent
    without llama-server, the sim judge's replica ready."""
    settings.LLMGW_SIMULATE = demo.parse_simulate(settings.SIMULATE_EMBEDDED)
    call_command("init", stdout=io.StringIO(), stderr=io.StringIO())
    join_node("this-machine", [], engines={"sim": "1"})
    for sim in settings.LLMGW_SIMULATE:
        cards = [
            c.split("x ", 1)[1].strip()
            for c in sim.cards.split(",")
            for _ in range(int(c.split("x")[0]))
        ]
        join_node(sim.name, cards, simulated=True, engines={"sim": "1"})
    Node.objects.update(last_heartbeat=reconciler.control_now())
    reconciler.tick()
    Replica.objects.filter(model_name=demo.SIM_JUDGE).update(state="ready")


def test_the_dashboard_says_what_the_baseline_judge_needs(
    first_start: None, client_for: Any, viewer: Any
) -> None:
    page = client_for(viewer).get("/", follow=True).content.decode()
    assert "no node has engine llamacpp" in page
    assert f"{BASELINE} cannot run yet" in page
    assert "bash scripts/build-llama-server.sh" in page
    assert "Qwen3Guard-Gen-0.6B.Q8_0.gguf" in page and "without internet" in page
    assert f"Meanwhile {demo.SIM_JUDGE} answers" in page


def test_the_judges_page_says_it_too(first_start: None, client_for: Any, viewer: Any) -> None:
    page = client_for(viewer).get(f"/guard/judges/{BASELINE}/").content.decode()
    assert "bash scripts/build-llama-server.sh" in page
    assert f"Meanwhile {demo.SIM_JUDGE} answers" in page
    # The sim judge's own page has nothing to fix.
    page = client_for(viewer).get(f"/guard/judges/{demo.SIM_JUDGE}/").content.decode()
    assert "cannot run yet" not in page


def test_a_judge_whose_weights_cannot_be_fetched_says_where_to_put_them(
    first_start: None, client_for: Any, viewer: Any
) -> None:
    """With llama-server built, an air-gapped machine's next wall is the download: the
    replica fails "downloading the weights failed", and the pages say what to do."""
    join_node("cpu-box", [], engines={"llamacpp": "b1", "sim": "1"})
    Replica.objects.filter(model_name=BASELINE).update(
        state="failed", reason="downloading the weights failed; retrying in 60 s"
    )
    for path in ("/", f"/guard/judges/{BASELINE}/"):
        page = client_for(viewer).get(path, follow=True).content.decode()
        assert f"{BASELINE} cannot run yet" in page and "could not fetch its weights" in page
        assert "Qwen3Guard-Gen-0.6B.Q8_0.gguf" in page and "without internet" in page
        assert f"Meanwhile {demo.SIM_JUDGE} answers" in page
