"""Per-profile rules: a profile's name, env, numbers and facility level, and its width
(cards, nodes, tp and pp) against what its engine can run.
"""

from __future__ import annotations

import math

from agent.discovery import is_mig_class
from agent.engines import ENGINES, arg_problems, env_warning, unsafe_args, unsafe_env
from catalog.rules.found import Found, Path, not_finite, num, profile_label
from catalog.rules.helpers import cpu_capable, cpu_only, parse_level
from catalog.spec import Model, Profile


def profile_warnings(m: Model) -> Found:
    """Return what is allowed in a model's profiles but may not do what is meant: a
    variable its engine does not document (passed as written; the engine may ignore it)."""
    out = Found()
    for i, p in enumerate(m.profiles):
        for key in sorted(p.env):
            if why := env_warning(key, p.engine):
                out.add(
                    ("profiles", i, "env", key), "undocumented_env", f"{profile_label(p, i)}: {why}"
                )
    return out


def check_profile(m: Model, p: Profile, at: Path, label: str, seen: set[str], out: Found) -> None:
    if not p.name:
        out.add((*at, "name"), "required", f"{label} has no name: give it one")
    elif p.name in seen:
        out.add(
            (*at, "name"),
            "duplicate_profile",
            f"{label} is declared twice: give each profile its own name",
        )
    seen.add(p.name)
    engine = p.engine if p.engine in ENGINES else ""
    for key in sorted(p.env):
        if why := unsafe_env(key, engine, str(p.env[key])):
            out.add(
                (*at, "env", key),
                "unsafe_env",
                f"{label}: env {key} is not allowed: {why}",
            )
    if not math.isfinite(p.weight):
        not_finite(out, (*at, "weight"), f"{label}: weight", p.weight)
    if p.capacity < 0:
        out.add(
            (*at, "capacity"),
            "negative_capacity",
            f"{label}: capacity {p.capacity} is negative: give the requests one replica "
            "carries within the slo (manage.py cluster bench measures it), or 0",
        )
    if not math.isfinite(p.power_watts):
        not_finite(out, (*at, "power_watts"), f"{label}: power_watts", p.power_watts)
    elif p.power_watts < 0:
        out.add(
            (*at, "power_watts"),
            "negative_power",
            f"{label}: power_watts {num(p.power_watts)} is negative: give what one "
            "replica draws, or 0 to derive it",
        )
    if p.keep_within:
        try:
            parse_level(p.keep_within)
        except ValueError as e:
            out.add((*at, "keep_within"), "bad_level", f"{label}: keep_within {e}")
    if p.engine not in ENGINES:
        # Every rule below depends on what the engine is.
        why = unsafe_args(p.engine, [])
        out.add((*at, "engine"), "unknown_engine", f"{label}: {why}")
        return
    for why in arg_problems(p.engine, p.args):
        out.add((*at, "args"), "unsafe_arg", f"{label}: {why}")
    if p.kv_events and p.engine != "vllm":
        out.add(
            (*at, "kv_events"),
            "kv_events_engine",
            f"{label}: kv_events is vLLM's; engine {p.engine} publishes no cache "
            "events: turn it off or use vllm",
        )
    _check_width(m, p, at, label, out)


def _check_width(m: Model, p: Profile, at: Path, label: str, out: Found) -> None:
    """Check a profile's cards and nodes against its engine's limits."""
    if p.gpu_class == "" and not cpu_capable(p.engine):
        out.add(
            (*at, "gpu_class"),
            "gpu_class_required",
            f"{label}: gpu_class is required for engine {p.engine}; only llamacpp "
            "runs without a GPU",
        )
    if cpu_only(p):
        if p.nodes > 1:
            out.add(
                (*at, "nodes"),
                "cpu_multi_node",
                f"{label}: a CPU profile cannot span {p.nodes} nodes: give it 1",
            )
        return
    # A process sees one MIG device, and instances have no NVLink or peer-to-peer
    # between them: a group of them is a replica that fails at start.
    wide = p.gpus_per_node > 1 or p.nodes > 1 or p.tp > 1 or p.pp > 1
    if is_mig_class(p.gpu_class) and wide:
        out.add(
            (*at, "gpu_class"),
            "mig_multi",
            f"{label}: {p.gpu_class} is a MIG instance, and a replica runs on exactly "
            "one: a process can open only one MIG device, and instances have no NVLink "
            "between them. Give it tp 1 and one GPU on one node, or use a whole-card "
            "class or a larger MIG profile",
        )
        return
    # llama.cpp splits a model across one node's cards by layer, as many as
    # gpus_per_node; it has no tensor parallelism to give a tp to.
    if p.engine == "llamacpp":
        if p.nodes > 1:
            out.add(
                (*at, "nodes"),
                "llamacpp_multi_node",
                f"{label}: llama.cpp does not span nodes; use vllm or sglang for a "
                f"{p.nodes}-node replica",
            )
        elif p.tp > 1 or p.pp > 1:
            out.add(
                (*at, "tp" if p.tp > 1 else "pp"),
                "llamacpp_tp",
                f"{label}: llama.cpp splits a model across a node's GPUs by layer, and "
                f"tp {p.tp * max(p.pp, 1)} does not agree with gpus_per_node "
                f"{p.gpus_per_node}: give gpus_per_node alone",
            )
        return
    # TensorRT-LLM spans machines only under MPI started from one of them, which the
    # agents do not do; and it loads a Hugging Face checkpoint, not a GGUF.
    if p.engine == "trtllm":
        if m.source.rstrip("/").lower().endswith(".gguf"):
            out.add(
                ("source",),
                "trtllm_gguf",
                f"{label}: trtllm loads a Hugging Face checkpoint, not a .gguf; serve "
                "a GGUF with llamacpp",
            )
        if p.nodes > 1:
            out.add(
                (*at, "nodes"),
                "trtllm_multi_node",
                f"{label}: trtllm runs a replica on one node; use vllm or sglang for a "
                f"{p.nodes}-node replica",
            )
            return
    # Otherwise the engine is handed a shard spec it cannot satisfy, and fails minutes
    # later while loading.
    pp = max(p.pp, 1)
    if p.gpus_per_node * p.nodes != p.tp * pp:
        out.add(
            (*at, "tp"),
            "tp_mismatch",
            f"{label}: {p.nodes} nodes x {p.gpus_per_node} GPUs does not match tp "
            f"{p.tp} x pp {pp}: make nodes x gpus_per_node equal tp x pp",
        )
