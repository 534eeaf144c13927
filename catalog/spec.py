"""The catalog's types as plain data: what a catalog file, the API and the database hold.

No Django here. Every field is named exactly as the file's key (the reference's koanf tag),
and declared in the reference's order, which is the order files are written in. Durations
are whole nanoseconds (see ``durations``); a field whose ``metadata["kind"]`` is
``"duration"`` is written as a Go duration string.

Optional nested blocks (``external``, ``canary``, ``eval``, ``guard``, ``origin``,
``previous``) are ``None`` when absent, as the reference's pointers are nil.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DURATION: dict[str, Any] = {"kind": "duration"}


@dataclass
class ScaleWindow:
    """A part of the week with its own min and max."""

    days: list[str] = field(default_factory=list)
    from_: str = field(default="", metadata={"key": "from"})
    to: str = ""
    min: int = 0
    max: int = 0


@dataclass
class Scaling:
    """How many replicas a model should have, and when."""

    min: int = 0
    max: int = 0
    idle_timeout: int = field(default=0, metadata=DURATION)
    schedule: list[ScaleWindow] = field(default_factory=list)
    prewarm: int = field(default=0, metadata=DURATION)


@dataclass
class SLO:
    """The latency a model is expected to meet."""

    ttft_p99: int = field(default=0, metadata=DURATION)
    tpot_p99: int = field(default=0, metadata=DURATION)


@dataclass
class Profile:
    """How a model runs on one GPU class (or on CPUs, with llama.cpp)."""

    name: str = ""
    engine: str = ""
    engine_version: str = ""
    gpu_class: str = ""
    tp: int = 0
    pp: int = 0
    gpus_per_node: int = 0
    nodes: int = 0
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    min_memory_gb: int = 0
    cpu_cores: int = 0
    min_disk_gb: int = 0
    node_selector: dict[str, str] = field(default_factory=dict)
    power_watts: float = 0.0
    keep_within: str = ""
    weight: float = 0.0
    # Requests one replica carries within the model's slo, as the capacity bench measured
    # it (``manage.py cluster bench``); 0: not measured (load scaling takes its engine's
    # default, cluster.scaling.DEFAULT_CAPACITY).
    capacity: int = 0
    priority: int = 0
    startup_timeout: int = field(default=0, metadata=DURATION)
    kv_events: bool = False


@dataclass
class External:
    """A provider outside the cluster that serves a model."""

    url: str = ""
    model: str = ""
    api_key_file: str = ""
    peer: str = ""


@dataclass
class Adapter:
    """A LoRA adapter served on a model's replicas."""

    name: str = ""
    source: str = ""
    scale: float = 0.0


@dataclass
class Canary:
    """A share of a model's requests sent to a candidate, and when to give up on it."""

    model: str = ""
    percent: int = 0
    min_requests: int = 0
    max_error_increase: float = 0.0
    max_ttft_ratio: float = 0.0


@dataclass
class EvalGate:
    """A quality suite a model's new weights must pass."""

    suite: str = ""
    min_score: float = 0.0
    judge: str = ""


@dataclass
class Capabilities:
    """What a client may ask a model for beyond plain completion."""

    tools: bool = False
    vision: bool = False
    embeddings: bool = False
    # Ranks documents against a query (POST /v1/rerank, /v2/rerank): a reranker model.
    rerank: bool = False


@dataclass
class GuardModel:
    """How a judge model's answers are read."""

    format: str = ""
    categories: list[str] = field(default_factory=list)


@dataclass
class OriginFile:
    """One weights file of an origin."""

    path: str = ""
    sha256: str = ""
    bytes: int = 0


@dataclass
class PreviousOrigin:
    """A model's source before an update, and where it came from."""

    source: str = ""
    revision: str = ""
    files: list[OriginFile] = field(default_factory=list)


@dataclass
class Origin:
    """Where a model's weights were published."""

    repo: str = ""
    revision: str = ""
    files: list[OriginFile] = field(default_factory=list)
    previous: PreviousOrigin | None = None


@dataclass
class Model:
    """A catalog entry: one model, how it can run, and how many replicas it should have."""

    name: str = ""
    aliases: list[str] = field(default_factory=list)
    description: str = ""
    source: str = ""
    profiles: list[Profile] = field(default_factory=list)
    scaling: Scaling = field(default_factory=Scaling)
    class_: str = field(default="", metadata={"key": "class"})
    owner: str = ""
    external: External | None = None
    adapters: list[Adapter] = field(default_factory=list)
    max_loaded_adapters: int = 0
    trust_remote_code: bool = False
    # "local": the model never crosses to a federated cluster (docs/federation.md): never
    # listed to nor reached by a peer's key, never sent on to a peer by a fallback,
    # canary or overflow. "" (the default): no such limit.
    residency: str = ""
    fallbacks: list[str] = field(default_factory=list)
    # The model (or alias) a request of a lower band goes to while admission holds that
    # band back for this model (its TTFT p99 past its slo), instead of waiting and 429.
    overflow: str = ""
    canary: Canary | None = None
    eval: EvalGate | None = None
    routing_profile: str = ""
    slo: SLO = field(default_factory=SLO)
    context_length: int = 0
    max_output: int = 0
    # What a token budget charges for a prompt token the engine read from its prefix
    # cache, as a share of a fresh one: 0 to 1 (1: cached tokens cost as much).
    cached_token_weight: float = 1.0
    capabilities: Capabilities = field(default_factory=Capabilities)
    role: str = ""
    guard: GuardModel | None = None
    origin: Origin | None = None


def key_of(f: Any) -> str:
    """Return the file key of a dataclass field (``class_`` is written ``class``)."""
    return f.metadata.get("key", f.name)
