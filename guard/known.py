"""The judges the cluster knows how to fetch and serve, and what enabling one makes.

``KNOWN`` holds Qwen3Guard-Gen 0.6B, 4B and 8B and Llama Guard 3 1B and 8B: where the
weights are (a GGUF for llama.cpp on CPUs, the Hugging Face repository for vLLM on a
GPU), the format the judge speaks, its context, its memory and the categories it can
report. ``enable_spec`` writes the catalog ``Model`` for one; ``use`` sets a policy's
judge order and makes its categories hold for them (``guard.policy.complete``);
``judges_to_add`` says which the leader adds because the policy names them. Plain
data in and out: no Django, no I/O. Section numbers (§) refer to
/work/shared/spec/guard-formats.md.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from catalog.rules import CLASS_STANDARD, ROLE_GUARD, suggest_cores
from catalog.spec import GuardModel, Model, Profile, Scaling
from guard import policy as policy_rules
from guard.formats import LLAMA_GUARD_CATEGORIES, QWEN3GUARD_CATEGORIES
from guard.policy import Policy

# What ``guard judge enable`` serves when it is given no name: the baseline's judge on
# CPUs, and with --gpu the 4B (the issue: "--gpu: the 4B on the GPU class with the most
# memory among the cluster's nodes").
DEFAULT_CPU_JUDGE = "qwen3guard-0.6b"
DEFAULT_GPU_JUDGE = "qwen3guard-4b"

# llama.cpp's own needs beside the weights and the KV cache (compute buffers, the
# server), a rough allowance.
RUNTIME_GB = 0.5


@dataclass(frozen=True)
class KnownJudge:
    """A judge model the cluster can fetch and serve.

    ``gguf`` is the file llama.cpp serves on CPUs, ``gguf_gb`` its size (10^9 bytes);
    ``hf_repo`` is what vLLM serves on a GPU, ``gpu_gb`` its BF16 weights. ``kv_bytes``
    is the KV cache per token at f16 (2 x layers x KV heads x head size x 2 bytes),
    from the base model's architecture, to size the CPU replica's memory.
    ``context_length`` is the window the catalog model is given; ``categories`` the
    names its verdicts report.
    """

    name: str
    description: str
    format: str
    variant: str | None
    gguf: str
    gguf_gb: float
    hf_repo: str
    gpu_gb: float
    context_length: int
    kv_bytes: int
    categories: tuple[str, ...]

    @property
    def memory_gb(self) -> float:
        """Return the GB a CPU replica holds: weights, its whole KV cache, the runtime."""
        return self.gguf_gb + self.kv_bytes * self.context_length / 1e9 + RUNTIME_GB

    @property
    def min_memory_gb(self) -> int:
        """Return ``memory_gb`` rounded up: the catalog's whole GB."""
        return math.ceil(self.memory_gb)


def _kv(layers: int, kv_heads: int, head_dim: int) -> int:
    return 2 * layers * kv_heads * head_dim * 2


_HF = "https://huggingface.co"
# The names Llama Guard's verdicts report: the model card's (guard.formats.llamaguard3).
_LLAMA_GUARD_NAMES = tuple(card for _, _, card in LLAMA_GUARD_CATEGORIES)

# Qwen3Guard: a 32,768-token window for all three sizes (§1.8); GGUFs from the community
# repositories the spec names or third parties use (§1.9 found no first-party listing).
# The 0.6B is Q8_0 at 0.8 GB, as measured on the PoC (the seed): a model that small
# loses the most to 4-bit. The 4B's Q4_K_M is 2.72 GB as a third-party listing gives
# it, the 8B's 5.03 GB is Qwen3-8B's Q4_K_M (§1.9 uses Qwen3-8B as the proxy): neither
# is confirmed by the spec. Llama Guard 3: the spec's Q4_K_M files and sizes (§2.9);
# its window is the base model's original 8,192 (§2.8) rather than the RoPE-scaled
# 131,072, as the classifiers were tuned on short conversations and 128k of KV cache is
# 16 GB for the 8B; a longer text is read by its start and end (guard.longtext).
KNOWN: dict[str, KnownJudge] = {
    j.name: j
    for j in (
        KnownJudge(
            name="qwen3guard-0.6b",
            description="Qwen3Guard-Gen 0.6B: Safe / Unsafe / Controversial and the categories",
            format="qwen3guard",
            variant=None,
            gguf=f"{_HF}/QuantFactory/Qwen3Guard-Gen-0.6B-GGUF/resolve/main/Qwen3Guard-Gen-0.6B.Q8_0.gguf",
            gguf_gb=0.81,
            hf_repo="Qwen/Qwen3Guard-Gen-0.6B",
            gpu_gb=1.5,
            context_length=32768,
            kv_bytes=_kv(28, 8, 128),
            categories=QWEN3GUARD_CATEGORIES,
        ),
        KnownJudge(
            name="qwen3guard-4b",
            description="Qwen3Guard-Gen 4B: Safe / Unsafe / Controversial and the categories",
            format="qwen3guard",
            variant=None,
            gguf=f"{_HF}/mradermacher/Qwen3Guard-Gen-4B-GGUF/resolve/main/Qwen3Guard-Gen-4B.Q4_K_M.gguf",
            gguf_gb=2.72,
            hf_repo="Qwen/Qwen3Guard-Gen-4B",
            gpu_gb=8.1,
            context_length=32768,
            kv_bytes=_kv(36, 8, 128),
            categories=QWEN3GUARD_CATEGORIES,
        ),
        KnownJudge(
            name="qwen3guard-8b",
            description="Qwen3Guard-Gen 8B: Safe / Unsafe / Controversial and the categories",
            format="qwen3guard",
            variant=None,
            gguf=f"{_HF}/mradermacher/Qwen3Guard-Gen-8B-GGUF/resolve/main/Qwen3Guard-Gen-8B.Q4_K_M.gguf",
            gguf_gb=5.03,
            hf_repo="Qwen/Qwen3Guard-Gen-8B",
            gpu_gb=16.4,
            context_length=32768,
            kv_bytes=_kv(36, 8, 128),
            categories=QWEN3GUARD_CATEGORIES,
        ),
        KnownJudge(
            name="llamaguard3-1b",
            description="Llama Guard 3 1B: safe, or unsafe and the S1-S13 categories",
            format="llamaguard3",
            variant="1b",
            gguf=f"{_HF}/itlwas/Llama-Guard-3-1B-Q4_K_M-GGUF/resolve/main/llama-guard-3-1b-q4_k_m.gguf",
            gguf_gb=0.955,
            hf_repo="meta-llama/Llama-Guard-3-1B",
            gpu_gb=3.0,
            context_length=8192,
            kv_bytes=_kv(16, 8, 64),
            # The 1B's template lists S1-S13 only (§2.5).
            categories=_LLAMA_GUARD_NAMES[:13],
        ),
        KnownJudge(
            name="llamaguard3-8b",
            description="Llama Guard 3 8B: safe, or unsafe and the S1-S14 categories",
            format="llamaguard3",
            variant="8b",
            gguf=f"{_HF}/QuantFactory/Llama-Guard-3-8B-GGUF/resolve/main/Llama-Guard-3-8B.Q4_K_M.gguf",
            gguf_gb=4.92,
            hf_repo="meta-llama/Llama-Guard-3-8B",
            gpu_gb=16.1,
            context_length=8192,
            kv_bytes=_kv(32, 8, 128),
            categories=_LLAMA_GUARD_NAMES,
        ),
    )
}


def get(name: str) -> KnownJudge:
    """Return the known judge of this name.

    Raises:
        ValueError: no known judge has that name (the message lists them).
    """
    try:
        return KNOWN[name]
    except KeyError:
        raise ValueError(f'no known judge "{name}": one of {", ".join(KNOWN)}') from None


def roomiest_class(gpu_classes: Mapping[str, int]) -> str:
    """Return the GPU class with the most memory (MiB); the first by name on a tie.

    Raises:
        ValueError: there is no GPU class.
    """
    if not gpu_classes:
        raise ValueError("the cluster's nodes report no GPU class: serve the judge on CPUs")
    return min(gpu_classes, key=lambda c: (-gpu_classes[c], c))


def enable_spec(
    name: str | None,
    *,
    gpu: bool = False,
    node_cores: Sequence[int] = (),
    gpu_classes: Mapping[str, int] | None = None,
    sim: bool = False,
) -> Model:
    """Return the catalog model that serves a known judge (``guard judge enable``).

    ``name`` None is the default: ``qwen3guard-0.6b`` on CPUs, ``qwen3guard-4b`` with
    ``gpu``. A name is served as asked, on CPUs or (``gpu``) on a GPU: every known judge
    has both profiles, and --gpu names where, not which.

    - CPUs: a llama.cpp profile with no GPU class, ``cpu_cores`` reserved by
      ``suggest_cores(node_cores)`` and ``min_memory_gb`` for the weights and the whole
      KV cache; the class is left unset, which a guard reads as critical (every judged
      request waits on it).
    - ``gpu``: a vLLM profile on the GPU class with the most memory among
      ``gpu_classes`` (name to MiB), as a standard-class model (the issue), so a
      judge does not take a card from the serving models by preemption.
    - ``sim``: the profile is the simulator's instead (``engine: sim``, no weights
      fetched), on the roomiest class of ``gpu_classes``, which for a demo or a test
      are the simulated nodes' classes; it replaces the real profile, so the model is
      simulated throughout (``catalog.rules.simulated``).

    Scaling is min 1: a judge must always run (``check_model``'s guard rule).

    Raises:
        ValueError: the name is unknown; ``gpu`` or ``sim`` and no GPU class is given;
            or the roomiest class has too little memory for the judge's weights.
    """
    judge = get(name or (DEFAULT_GPU_JUDGE if gpu else DEFAULT_CPU_JUDGE))
    model = Model(
        name=judge.name,
        description=judge.description,
        scaling=Scaling(min=1, max=1),
        context_length=judge.context_length,
        role=ROLE_GUARD,
        # Llama Guard's verdicts report the model card's names unless told others
        # (guard.formats.llamaguard3), and Qwen3Guard's categories are fixed (§1.6):
        # no list is needed for either.
        guard=GuardModel(format=judge.format),
    )
    if sim or gpu:
        gpu_class = roomiest_class(gpu_classes or {})
        if (
            not sim
            and gpu_classes is not None
            and gpu_classes[gpu_class] < judge.gpu_gb * 1e9 / 2**20
        ):
            raise ValueError(
                f"{judge.name} needs {judge.gpu_gb:g} GB of GPU memory and the roomiest "
                f"class, {gpu_class}, has {gpu_classes[gpu_class]} MiB: serve it on CPUs "
                "or enable a smaller judge"
            )
    if sim:
        model.source = judge.hf_repo
        model.profiles = [Profile(name="sim", engine="sim", gpu_class=gpu_class, gpus_per_node=1)]
        if gpu:
            model.class_ = CLASS_STANDARD
    elif gpu:
        model.source = judge.hf_repo
        model.class_ = CLASS_STANDARD
        model.profiles = [Profile(name="gpu", engine="vllm", gpu_class=gpu_class, gpus_per_node=1)]
    else:
        model.source = judge.gguf
        model.profiles = [
            Profile(
                name="cpu",
                engine="llamacpp",
                cpu_cores=suggest_cores(node_cores),
                min_memory_gb=judge.min_memory_gb,
            )
        ]
    return model


# The rule that makes a policy's categories hold for every judge is the policy's own
# (``guard.policy.complete``); ``use`` applies it to a new order of judges.
EQUIVALENTS = policy_rules.EQUIVALENTS
equivalents = policy_rules.equivalents
Replacement = policy_rules.Replacement


def all_reports(catalog: Mapping[str, Sequence[str]] | None = None) -> dict[str, tuple[str, ...]]:
    """Return every judge there is with the categories it reports: the known judges, and
    over them ``catalog`` (each guard model in the catalog, as the lead reads it)."""
    out = {name: kj.categories for name, kj in KNOWN.items()}
    out.update({name: tuple(cats) for name, cats in (catalog or {}).items()})
    return out


def use(
    policy: Policy,
    names: Sequence[str],
    *,
    reports: Mapping[str, Sequence[str]] | None = None,
) -> tuple[Policy, list[Replacement]]:
    """Return the policy with ``names`` as its judges, in order, and what was replaced.

    ``guard.policy.complete`` with ``drop_unreportable``: each category none of the
    judges can report is replaced by its equivalents that one of them can, or removed
    when there are none, and each kept category's equivalents in every listed judge's
    names are added. What a judge reports comes from ``reports`` (name to categories:
    the lead passes the catalog's guard models'), else from ``KNOWN``.

    Raises:
        ValueError: no names, a name given twice, or a name neither ``reports`` nor
            ``KNOWN`` knows.
    """
    if not names:
        raise ValueError("name at least one judge")
    every = all_reports(reports)
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ValueError(f'judge "{name}" is listed twice: list each once')
        if name not in every:
            raise ValueError(
                f'no judge "{name}" in the catalog or known: one of {", ".join(sorted(every))}'
            )
    new, changes, problems = policy_rules.complete(
        replace(policy, judge_models=tuple(names)), every, drop_unreportable=True
    )
    assert new is not None and not problems, problems
    return new, changes


def judges_to_add(
    named: Sequence[str],
    in_catalog: Collection[str],
    deleted_since_policy: Collection[str] = (),
    known: Collection[str] = tuple(KNOWN),
) -> list[str]:
    """Return the judges the leader adds to the catalog, in the policy's order.

    ``named`` are the policy's judges, ``in_catalog`` the catalog's model names,
    ``deleted_since_policy`` the names an operator deleted from the catalog after the
    policy last changed, ``known`` the judges llmgw can serve. A judge is added when the
    policy names it, the catalog lacks it, it is known, and no operator deleted it since
    the policy last changed: the later word wins, so a deletion is not undone behind the
    operator's back, and a policy saved after it (still naming the judge) brings it back.
    A name in the catalog is never touched, whatever it holds: what an operator made of
    it stays.
    """
    out: list[str] = []
    for name in named:
        if name in in_catalog or name not in known or name in deleted_since_policy:
            continue
        if name not in out:
            out.append(name)
    return out
