"""The inference engines the agent runs, and what a catalog may not ask of them.

The catalog's rules call ``unsafe_env`` and ``arg_problems`` (as the reference's catalog
imports its engines package): the checks live beside the command lines that would run
them (``agent.flags``, by each engine's own flag table), and the agent refuses at run
time whatever the rules would (``command_for``). No Django here.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "sglang", "llamacpp", "trtllm", "sim")

# Setting it switches vLLM to loading adapters on demand; the catalog sets it only
# through max_loaded_adapters (see catalog.rules).
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

# The rules of what a catalog may hand an engine live in agent.flags, by each engine's
# own flag table; they are re-exported here, where the catalog's rules import them.
from agent.flags import (  # noqa: E402
    REPO_ID_FLAGS,
    arg_problems,
    env_warning,
    spelled,
    unsafe_args,
    unsafe_env,
)

__all__ = ["arg_problems", "env_warning", "unsafe_args", "unsafe_env"]


# Ports beside the one the agent assigns a replica, at fixed offsets from it, so that
# whoever knows the reported port knows these too without a field of their own:
# the router subscribes to a vLLM replica's KV events at port + 1, and the ranks of a
# multi-node replica meet rank 0 at port + 2 of the leader named in their entries.
KV_EVENTS_PORT_OFFSET = 1
RENDEZVOUS_PORT_OFFSET = 2

# The router hashes prompt blocks the way vLLM does only with this algorithm and a
# fixed hash seed (see the catalog's kv_events).
KV_HASH_ALGO = "sha256_cbor"
KV_HASH_SEED = "0"

# The folder holding the agent package: the simulator runs as ``python -m agent.sim``
# from there, whether or not the agent is installed into the interpreter.
AGENT_ROOT = str(Path(__file__).resolve().parent.parent)

LORA_SCALED_PAIR = "pair"  # llama.cpp before late 2025: --lora-scaled FNAME SCALE
LORA_SCALED_COLON = "colon"  # llama.cpp since: --lora-scaled FNAME:SCALE


# Where each engine takes its replica's engine key (docs/agent-protocol.md, "Engine keys"):
# from the environment where it reads one, so ``ps`` does not show it. SGLang takes it
# only as ``--api-key``; trtllm-serve has no key at all.
LLAMA_KEY_ENV = "LLAMA_API_KEY"
VLLM_KEY_ENV = "VLLM_API_KEY"
SIM_KEY_ENV = "LLMGW_SIM_API_KEY"
SGLANG_KEY_FLAG = "--api-key"
# vLLM reports a prompt's cached tokens in its usage only with this flag.
VLLM_CACHED_TOKENS_FLAG = "--enable-prompt-tokens-details"
# What a catalog may never set, as the agent's own: the key flags and variables above,
# and llama-server's other way to its keys. (agent.flags refuses them for every engine:
# tests/agent/test_engine_flags.py holds it.)
KEY_FLAGS = frozenset({"--api-key", "--api-key-file"})
KEY_ENV = frozenset({LLAMA_KEY_ENV, VLLM_KEY_ENV, SIM_KEY_ENV})


class CommandError(ValueError):
    """Refuse to build an engine's command line; the message says why, for a person."""


@dataclass(frozen=True)
class Command:
    """Hold an engine's command line and the environment it adds to the agent's own."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    # None for a headless rank (rank > 0 of a multi-node replica): it serves no HTTP,
    # rank 0 answers for the whole replica.
    health_path: str | None = "/health"
    # What the operator should know of this command line; the agent logs them.
    warnings: list[str] = field(default_factory=list)


def default_binaries() -> dict[str, str]:
    """Return the programs the engines are started with when the node names no others."""
    return {
        "llama-server": "llama-server",
        "llama-server-lora-scaled": LORA_SCALED_PAIR,
        "vllm": "vllm",
        "trtllm-serve": "trtllm-serve",
        # SGLang is a Python package run as a module, and so is the simulator: the
        # agent's own interpreter is the one discovery found them in.
        "python": sys.executable,
    }


def extra_port_offsets(replica: Mapping[str, Any]) -> list[int]:
    """Return the offsets from a replica's port that its engine listens on as well."""
    offsets = []
    if replica.get("engine") == "vllm" and replica.get("kv_events"):
        offsets.append(KV_EVENTS_PORT_OFFSET)
    if _int(replica, "nodes", 1) > 1 and _int(replica, "rank", 0) == 0:
        offsets.append(RENDEZVOUS_PORT_OFFSET)
    return offsets


def command_for(
    replica: Mapping[str, Any],
    port: int,
    weights_path: str,
    binaries: Mapping[str, str] | None = None,
    *,
    host: str = "127.0.0.1",
    node_address: str = "",
    adapters: Mapping[str, str] | None = None,
    devices: Mapping[int, str] | None = None,
    adapter_dir: str = "",
) -> Command:
    """Build the command line that runs a desired replica's engine.

    Args:
        replica: the desired replica, as docs/agent-protocol.md gives it.
        port: the port the agent picked; the ports at ``extra_port_offsets`` from it
            must be free too.
        weights_path: the resolved source: a local path, or a Hugging Face id handed to
            an engine that fetches it itself.
        binaries: the programs to run (``default_binaries`` fills in what is missing).
        host: the address the engine listens on.
        node_address: how the other nodes reach this one; rank 0 of a multi-node
            replica has its peers meet it there.
        adapters: each adapter's resolved local path by name; an adapter missing here
            is used at its source.
        devices: what ``CUDA_VISIBLE_DEVICES`` calls each card index (a MIG instance is
            named by its UUID); a card missing here is called by its index.
        adapter_dir: where the adapters of a vLLM replica that loads them on demand
            are found by name (``max_loaded_adapters`` above 0).

    The replica's ``engine_key`` (when the control plane sends one) is given to the
    engine as its API key: in its environment (llama-server, vLLM, the sim), on its
    command line (SGLang, which reads it nowhere else), never to trtllm-serve (which has
    no key; a warning says so).

    Raises:
        CommandError: the replica asks for what its engine cannot do.
    """
    bins = {**default_binaries(), **(binaries or {})}
    engine = replica.get("engine", "")
    args, env = _checked(replica, engine)
    args = _own_tokenizer(engine, args, str(replica.get("source") or ""), weights_path)
    paths = {a["name"]: (adapters or {}).get(a["name"], a["source"]) for a in _adapters(replica)}
    build = _BUILDERS[engine]
    argv, extra_env, health = build(
        replica, port, weights_path, bins, host, node_address, paths, adapter_dir
    )
    env.update(extra_env)
    if replica.get("trust_remote_code") and engine in _TRUST_FLAG:
        # The model's trust_remote_code, set on purpose in the catalog: the one way the
        # engine runs the Python files that come with the model (agent.flags refuses
        # the flag in a profile's args).
        argv.append(_TRUST_FLAG[engine])
    cpu_cores = _int(replica, "cpu_cores", 0)
    if cpu_cores > 0 and engine in ("vllm", "sglang", "trtllm"):
        # The PyTorch engines size their CPU thread pools from this; without it each
        # takes every core of the node and replicas sharing one spin against each other.
        env.setdefault("OMP_NUM_THREADS", str(cpu_cores))
    # Set last, over anything the profile says: the agent assigns the cards, and an
    # empty value keeps a CPU replica off every GPU rather than on all of them.
    names = devices or {}
    env["CUDA_VISIBLE_DEVICES"] = ",".join(
        names.get(int(c), str(c)) for c in replica.get("cards") or []
    )
    warnings = []
    if engine == "trtllm" and _key(replica):
        warnings.append(
            "trtllm-serve takes no API key: this replica's port answers whoever reaches it; "
            "keep --engine-host on an address only the gateway and the guard reach"
        )
    if replica.get("kv_events"):
        overridden = sorted({a.split("=", 1)[0] for a in args} & _KV_FLAGS)
        if overridden:
            warnings.append(
                f"kv_events: the profile's {', '.join(overridden)} overrides what the router's "
                "KV index assumes; the index stays empty for this replica"
            )
    return Command(argv=argv + args, env=env, health_path=health, warnings=warnings)


def _own_tokenizer(engine: str, args: list[str], source: str, weights_path: str) -> list[str]:
    """Return the arguments with a tokenizer flag naming the model's own source given the
    local copy of it (``weights_path``): the engine reads the mirrored files, fetching
    nothing. Another repository id is left as written."""
    flags = REPO_ID_FLAGS.get(engine, frozenset())
    if not source or not flags:
        return args
    out = list(args)
    for i, a in enumerate(out):
        name, eq, value = a.partition("=")
        if name in flags and eq and value == source:
            out[i] = f"{name}={weights_path}"
        elif a in flags and i + 1 < len(out) and out[i + 1] == source:
            out[i + 1] = weights_path
    return out


def _checked(replica: Mapping[str, Any], engine: str) -> tuple[list[str], dict[str, str]]:
    """Return the profile's arguments (as the engine spells them) and environment, or
    raise CommandError for an engine, argument, variable or kv_events it cannot have."""
    if engine not in ENGINES:
        raise CommandError(f'engine "{engine}" is not one of {", ".join(ENGINES)}')
    args = [str(a) for a in replica.get("args") or []]
    why = unsafe_args(engine, args)
    if why:
        raise CommandError(why)
    env = {str(k): str(v) for k, v in (replica.get("env") or {}).items()}
    for key, value in env.items():
        why = unsafe_env(key, engine, value)
        if why:
            raise CommandError(f"env {key} is not allowed: {why}")
    if replica.get("kv_events") and engine != "vllm":
        raise CommandError(f'kv_events is vLLM\'s; engine "{engine}" publishes no cache events')
    return spelled(engine, args), env


# Arguments that undo what kv_events sets: events published, hashed as the router does.
_KV_FLAGS = frozenset(
    {"--kv-events-config", "--prefix-caching-hash-algo", "--no-enable-prefix-caching"}
)


_Built = tuple[list[str], dict[str, str], str | None]

# How each engine that can run a model's own Python files is told to.
_TRUST_FLAG = {
    "vllm": "--trust-remote-code",
    "sglang": "--trust-remote-code",
    "trtllm": "--trust_remote_code",
}


def _key(replica: Mapping[str, Any]) -> str:
    """Return the replica's engine key, or "" (a control plane from before engine keys)."""
    return str(replica.get("engine_key") or "")


def _int(replica: Mapping[str, Any], key: str, default: int) -> int:
    value = replica.get(key)
    return int(value) if value else default


def _adapters(replica: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(replica.get("adapters") or [])


def _peers(replica: Mapping[str, Any], port: int, node_address: str) -> tuple[str, int] | None:
    """Return where the ranks of a multi-node replica meet, or None for one node."""
    nodes = _int(replica, "nodes", 1)
    if nodes <= 1:
        return None
    rank = _int(replica, "rank", 0)
    if rank == 0:
        if not node_address:
            raise CommandError(
                "rank 0 of a multi-node replica needs the address the other nodes reach "
                "this one at: start the agent with --advertise-address"
            )
        return node_address, port + RENDEZVOUS_PORT_OFFSET
    leader = str(replica.get("leader") or "")
    leader_host, sep, leader_port = leader.rpartition(":")
    if not sep or not leader_host or not leader_port.isdigit():
        raise CommandError(
            f'rank {rank} of a multi-node replica needs its leader as host:port, not "{leader}"'
        )
    return leader_host, int(leader_port) + RENDEZVOUS_PORT_OFFSET


def _llamacpp(
    replica: Mapping[str, Any],
    port: int,
    weights_path: str,
    bins: Mapping[str, str],
    host: str,
    node_address: str,
    adapters: Mapping[str, str],
    adapter_dir: str,
) -> _Built:
    if _int(replica, "nodes", 1) > 1:
        raise CommandError(
            "llama.cpp does not span nodes; use vllm or sglang for a multi-node replica"
        )
    argv = [bins["llama-server"], "-m", weights_path, "--host", host, "--port", str(port)]
    argv += ["--alias", str(replica.get("served_name") or replica.get("model") or "")]
    cpu_cores = _int(replica, "cpu_cores", 0)
    if cpu_cores > 0:
        argv += ["-t", str(cpu_cores)]
    if replica.get("cards"):
        # Every layer on the cards it was given: the split between them is by layer.
        argv += ["-ngl", "999"]
    colon = bins.get("llama-server-lora-scaled") == LORA_SCALED_COLON
    for adapter in _adapters(replica):
        path = adapters[adapter["name"]]
        given = adapter.get("scale")
        scale = 1.0 if given is None else float(given)
        if scale == 1.0:
            argv += ["--lora", path]
        elif colon:
            argv += ["--lora-scaled", f"{path}:{scale:g}"]
        else:
            argv += ["--lora-scaled", path, f"{scale:g}"]
    context = _int(replica, "context_length", 0)
    if context > 0:
        argv += ["--ctx-size", str(context)]
    if replica.get("rerank"):
        # A reranker model: llama-server answers /v1/rerank only with it.
        argv.append("--reranking")
    env = {LLAMA_KEY_ENV: key} if (key := _key(replica)) else {}
    return argv, env, "/health"


def _vllm(
    replica: Mapping[str, Any],
    port: int,
    weights_path: str,
    bins: Mapping[str, str],
    host: str,
    node_address: str,
    adapters: Mapping[str, str],
    adapter_dir: str,
) -> _Built:
    argv = [bins["vllm"], "serve", weights_path, "--host", host, "--port", str(port)]
    argv += ["--served-model-name", str(replica.get("served_name") or replica.get("model") or "")]
    argv += ["--tensor-parallel-size", str(_int(replica, "tp", 1))]
    argv += ["--pipeline-parallel-size", str(_int(replica, "pp", 1))]
    # Usage then says the prompt's cached tokens (prompt_tokens_details.cached_tokens), as
    # llama-server's and SGLang's do by default: the gateway counts them and charges them.
    argv.append(VLLM_CACHED_TOKENS_FLAG)
    env: dict[str, str] = {}
    key = _key(replica)
    if key:
        # Read by vLLM when --api-key is not given; it guards the /v1 routes only.
        env[VLLM_KEY_ENV] = key
    health: str | None = "/health"
    peers = _peers(replica, port, node_address)
    if peers:
        rank = _int(replica, "rank", 0)
        # vLLM's own multi-node multiprocessing: no Ray cluster for the agents to run.
        argv += ["--distributed-executor-backend", "mp"]
        argv += ["--nnodes", str(_int(replica, "nodes", 1)), "--node-rank", str(rank)]
        argv += ["--master-addr", peers[0].strip("[]"), "--master-port", str(peers[1])]
        if rank > 0:
            argv.append("--headless")
            health = None
    listed = _adapters(replica)
    max_loaded = _int(replica, "max_loaded_adapters", 0)
    if max_loaded > 0:
        if not adapter_dir:
            raise CommandError("adapters loaded on demand need a folder to find them in")
        # Loaded on the first request that names one, from adapter_dir/<name>, by
        # vLLM's filesystem resolver; at most max_loaded at once.
        argv += ["--enable-lora", "--max-loras", str(max_loaded)]
        env[RUNTIME_LORA_ENV] = "True"
        env["VLLM_PLUGINS"] = "lora_filesystem_resolver"
        env["VLLM_LORA_RESOLVER_CACHE_DIR"] = adapter_dir
    elif listed:
        argv += ["--enable-lora", "--lora-modules"]
        argv += [f"{a['name']}={adapters[a['name']]}" for a in listed]
        argv += ["--max-loras", str(len(listed))]
    context = _int(replica, "context_length", 0)
    if context > 0:
        argv += ["--max-model-len", str(context)]
    if replica.get("kv_events"):
        config = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{port + KV_EVENTS_PORT_OFFSET}",
        }
        argv += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
        argv += ["--prefix-caching-hash-algo", KV_HASH_ALGO]
        env["PYTHONHASHSEED"] = KV_HASH_SEED
    return argv, env, health


def _sglang(
    replica: Mapping[str, Any],
    port: int,
    weights_path: str,
    bins: Mapping[str, str],
    host: str,
    node_address: str,
    adapters: Mapping[str, str],
    adapter_dir: str,
) -> _Built:
    argv = [bins["python"], "-m", "sglang.launch_server", "--model-path", weights_path]
    argv += ["--served-model-name", str(replica.get("served_name") or replica.get("model") or "")]
    argv += ["--tp-size", str(_int(replica, "tp", 1)), "--pp-size", str(_int(replica, "pp", 1))]
    health: str | None = "/health"
    peers = _peers(replica, port, node_address)
    if peers:
        rank = _int(replica, "rank", 0)
        argv += ["--nnodes", str(_int(replica, "nodes", 1)), "--node-rank", str(rank)]
        argv += ["--dist-init-addr", f"{peers[0]}:{peers[1]}"]
        if rank > 0:
            # The other ranks serve no HTTP: rank 0 answers for the replica.
            health = None
    argv += ["--host", host, "--port", str(port)]
    key = _key(replica)
    if key:
        # SGLang reads its key from the command line only: ``ps`` shows it to whoever
        # shares the node (docs/agent-protocol.md).
        argv += ["--api-key", key]
    listed = _adapters(replica)
    if listed:
        argv += ["--enable-lora", "--lora-paths"]
        argv += [f"{a['name']}={adapters[a['name']]}" for a in listed]
        argv += ["--max-loras-per-batch", str(len(listed))]
    context = _int(replica, "context_length", 0)
    if context > 0:
        argv += ["--context-length", str(context)]
    return argv, {}, health


def _trtllm(
    replica: Mapping[str, Any],
    port: int,
    weights_path: str,
    bins: Mapping[str, str],
    host: str,
    node_address: str,
    adapters: Mapping[str, str],
    adapter_dir: str,
) -> _Built:
    if _int(replica, "nodes", 1) > 1:
        raise CommandError(
            "TensorRT-LLM spans nodes only under an MPI launcher, which the agent does not "
            "run; use vllm or sglang for a multi-node replica"
        )
    if _adapters(replica):
        raise CommandError(
            "the agent does not give TensorRT-LLM adapters; use vllm, sglang or llamacpp "
            "for a model with adapters"
        )
    argv = [bins["trtllm-serve"], weights_path, "--host", host, "--port", str(port)]
    argv += ["--served_model_name", str(replica.get("served_name") or replica.get("model") or "")]
    argv += ["--tp_size", str(_int(replica, "tp", 1)), "--pp_size", str(_int(replica, "pp", 1))]
    context = _int(replica, "context_length", 0)
    if context > 0:
        argv += ["--max_seq_len", str(context)]
    return argv, {}, "/health"


def _sim(
    replica: Mapping[str, Any],
    port: int,
    weights_path: str,
    bins: Mapping[str, str],
    host: str,
    node_address: str,
    adapters: Mapping[str, str],
    adapter_dir: str,
) -> _Built:
    argv = [bins["python"], "-m", "agent.sim", "--host", host, "--port", str(port)]
    argv += ["--model", str(replica.get("served_name") or replica.get("model") or "")]
    env = {"PYTHONPATH": AGENT_ROOT}
    key = _key(replica)
    if key:
        env[SIM_KEY_ENV] = key
    guard = replica.get("guard") or {}
    if guard.get("format"):
        argv += ["--guard-format", str(guard["format"])]
        if guard.get("categories"):
            argv += ["--guard-categories", ",".join(str(c) for c in guard["categories"])]
    context = _int(replica, "context_length", 0)
    if context > 0:
        argv += ["--context-length", str(context)]
    # A source that is a file or folder on this node (the mirror's copy) is the sim's
    # weights file: how well it answers (agent.simweights); any other is a name only.
    if weights_path and os.path.exists(weights_path):
        argv += ["--weights", weights_path]
    return argv, env, "/health"


_BUILDERS = {
    "llamacpp": _llamacpp,
    "vllm": _vllm,
    "sglang": _sglang,
    "trtllm": _trtllm,
    "sim": _sim,
}
