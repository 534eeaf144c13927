"""What to do when a model can run nowhere for want of an engine: words for the console.

On a first start the baseline judge (a llama.cpp CPU model) has no node to run on until
``llama-server`` is built, and on an air-gapped machine its weights cannot be fetched.
``engine_hints`` is a plain function of the catalog's models and the nodes' engines;
``hints_for`` reads them from the database for the console's pages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings

from catalog.services import stored_specs
from catalog.spec import Model
from cluster.choices import NodeHealth, ReplicaState
from cluster.models import Node, Replica

# What each engine is, and how a node gets it. The agent reports the engines it finds
# (agent/discovery.py); a node that has one runs it after its agent restarts.
ENGINES: dict[str, tuple[str, tuple[str, ...]]] = {
    "llamacpp": (
        "llama-server (llama.cpp's server, the llamacpp engine)",
        (
            "Build it once on the node: bash scripts/build-llama-server.sh. It prints where "
            "it put the binary (~/.cache/llmgw/llama-server), which is where the agent looks; "
            "or put llama-server on the node's PATH, or start the agent with "
            "--llama-server PATH.",
            "Then restart the node's agent (on this machine: python3 run.py again); it "
            "reports the engine, and the replica is placed at the next tick.",
        ),
    ),
    "vllm": (
        "vLLM",
        ("Install vLLM on the node (pip install vllm, beside the agent), then restart its agent.",),
    ),
    "sglang": (
        "SGLang",
        ('Install SGLang on the node (pip install "sglang[all]"), then restart its agent.',),
    ),
    "trtllm": (
        "TensorRT-LLM",
        ("Install TensorRT-LLM on the node (trtllm-serve on its PATH), then restart its agent.",),
    ),
}


@dataclass(frozen=True)
class NodeEngines:
    """What a node offers engines: whether it takes replicas, is simulated, and runs."""

    name: str
    schedulable: bool
    simulated: bool
    engines: frozenset[str]


@dataclass(frozen=True)
class Hint:
    """Why a model can run nowhere, and what to do: plain sentences."""

    model: str
    engine: str
    missing: str
    steps: tuple[str, ...]
    weights: tuple[str, ...] = ()


def _file_name(source: str) -> str:
    return Path(unquote(urlsplit(source).path)).name or "the model's file"


def engine_hints(
    models: Iterable[Model], nodes: Sequence[NodeEngines], weights_dir: str = ""
) -> dict[str, Hint]:
    """Return, by model name, the hint for each model no node can run for want of an engine.

    A model gets one when none of its profiles' engines runs on a ready real node (the
    sim engine runs everywhere, and only it runs on simulated nodes); the hint names the
    first profile's engine. A model whose source is a URL also says how to bring its
    weights to a machine without internet (``weights_dir``: this machine's agent's).
    """
    real = set()
    for n in nodes:
        if n.schedulable and not n.simulated:
            real |= n.engines
    out = {}
    for m in models:
        engines = [p.engine for p in m.profiles]
        if not engines or "sim" in engines or any(e in real for e in engines):
            continue
        engine = engines[0]
        what, steps = ENGINES.get(
            engine, (engine, (f"Install {engine} on a node, then restart its agent.",))
        )
        weights: tuple[str, ...] = ()
        if m.source.startswith(("http://", "https://")):
            name = _file_name(m.source)
            here = f" (on this machine: {weights_dir})" if weights_dir else ""
            weights = (
                f"Its weights are fetched by the node from {m.source}. On a machine "
                f"without internet, download {name} elsewhere, copy it into the node's "
                f"weights folder{here}, an agent's --weights-dir elsewhere, and set the "
                "model's source to that file's path (or to a mirror's URL).",
            )
        out[m.name] = Hint(m.name, engine, f"{what} is on no ready node", steps, weights)
    return out


# What a replica's reason starts with when its node could not fetch its weights
# (agent/weights.py): the same words whoever reads it.
DOWNLOAD_FAILED = "downloading the weights failed"


def weights_hints(
    models: Iterable[Model], failed_downloads: Iterable[str], weights_dir: str = ""
) -> dict[str, Hint]:
    """Return, by model name, the hint for each model whose node could not fetch its
    weights (``failed_downloads``: the models with such a replica), as on a machine with
    no internet: where to put the file instead."""
    failed = set(failed_downloads)
    out = {}
    for m in models:
        if m.name not in failed:
            continue
        name = _file_name(m.source)
        here = f" (on this machine: {weights_dir})" if weights_dir else ""
        steps = (
            f"On a machine without internet, download {name} elsewhere (from {m.source}), "
            f"copy it into the node's weights folder{here}, or an agent's --weights-dir "
            "elsewhere, and set the model's source to that file's path.",
            "Or set the source to a mirror's URL the nodes reach (an agent fetches only from "
            "the hosts its --weights-hosts allows).",
        )
        out[m.name] = Hint(m.name, "", "its node could not fetch its weights", (), steps)
    return out


def node_engines() -> list[NodeEngines]:
    """Read every node's engines (one query)."""
    return [
        NodeEngines(name, health == NodeHealth.READY and not cordoned, simulated, frozenset(eng))
        for name, health, cordoned, simulated, eng in Node.objects.values_list(
            "name", "health", "cordoned", "simulated", "engines"
        )
    ]


def hints_for(names: Iterable[str]) -> dict[str, Hint]:
    """Return the hints for these catalog models, read from the database."""
    wanted = set(names)
    if not wanted:
        return {}

    weights = str(Path(settings.DATA_DIR) / "agent" / "weights")
    models = stored_specs(names=wanted)
    failed = Replica.objects.filter(
        model_name__in=wanted, state=ReplicaState.FAILED, reason__startswith=DOWNLOAD_FAILED
    ).values_list("model_name", flat=True)
    # A missing engine comes first: without it, weights would not help.
    return {
        **weights_hints(models, failed, weights),
        **engine_hints(models, node_engines(), weights),
    }


def hint_for(name: str) -> Hint | None:
    """Return the hint for one catalog model, or None."""
    return hints_for([name]).get(name)
