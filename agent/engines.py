"""The inference engines the agent runs, and what a catalog may not ask of them.

The catalog's rules call ``unsafe_env`` and ``arg_problems`` (as the reference's catalog
imports its engines package): the checks live beside the command lines that would run
them, so a flag the agent starts setting is refused in the same change, and the agent
refuses at run time whatever the rules would (``command_for``). What an operator may pass
is an allowlist per engine (``ALLOWED_FLAGS``, ``ALLOWED_ENV``): a denylist is defeated by
argparse's prefix matching. No Django here.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("vllm", "sglang", "llamacpp", "trtllm", "sim")

# Setting it switches vLLM to loading adapters on demand; the catalog sets it only
# through max_loaded_adapters (see catalog.rules).
RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON_ENV = frozenset(
    {
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
    }
)
_DEVICE_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)

# What to write instead of a flag the agent sets, by the catalog field that holds it.
_PORT = "the agent assigns each replica its address and port"
_SOURCE = "set the model's source instead"
_NAME = "the model's name (and aliases) is what it is served as"
_TP = "set the profile's tp instead"
_PP = "set the profile's pp instead"
_NODES = "set the profile's nodes instead; the agents wire the nodes together"
_THREADS = "set the profile's cpu_cores instead"
_LORA = "list the adapters in the model's adapters instead"
_GUARD = "the model's guard format and categories are what the judge answers with"

_AGENT_FLAGS = {"--host": _PORT, "--port": _PORT}
_ENGINE_FLAGS: dict[str, dict[str, str]] = {
    "vllm": {
        **_AGENT_FLAGS,
        "--model": _SOURCE,
        "--served-model-name": _NAME,
        "--tensor-parallel-size": _TP,
        "-tp": _TP,
        "--pipeline-parallel-size": _PP,
        "-pp": _PP,
    },
    "sglang": {
        **_AGENT_FLAGS,
        "--model-path": _SOURCE,
        "--served-model-name": _NAME,
        "--tp-size": _TP,
        "--tp": _TP,
        "--pp-size": _PP,
        "--nnodes": _NODES,
        "--node-rank": _NODES,
        "--dist-init-addr": _NODES,
    },
    "trtllm": {**_AGENT_FLAGS, "--tp_size": _TP, "--pp_size": _PP},
    "llamacpp": {
        **_AGENT_FLAGS,
        "-m": _SOURCE,
        "--model": _SOURCE,
        "-mu": _SOURCE,
        "--model-url": _SOURCE,
        "-hf": _SOURCE,
        "-hfr": _SOURCE,
        "--hf-repo": _SOURCE,
        "-a": _NAME,
        "--alias": _NAME,
        "-t": _THREADS,
        "--threads": _THREADS,
        "--lora": _LORA,
        "--lora-scaled": _LORA,
    },
    "sim": {
        **_AGENT_FLAGS,
        "--model": _NAME,
        "--guard-format": _GUARD,
        "--guard-categories": _GUARD,
    },
}

# What an operator may pass each engine: exact names only (the engines' argparse would take
# a prefix of a name, which is why nothing but these passes), each with the shape of its
# value. None: a switch, no value. Left out on purpose: anything naming a file or folder
# (--log-file, --chat-template-file, --download-dir, --ssl-*), an API key (the engine would
# refuse the control plane and the guard), a download source (-hf, --model-url), plugins
# and code (--middleware), and what the agent sets (``_ENGINE_FLAGS``). docs/catalog.md
# lists them.


@dataclass(frozen=True)
class Shape:
    """What a flag's value must look like: a name for messages and a whole-value pattern."""

    what: str
    pattern: re.Pattern[str]
    optional: bool = False  # the value may be left out (a bare switch)

    def fits(self, value: str) -> bool:
        """Return whether ``value`` is a value of this shape."""
        return bool(self.pattern.fullmatch(value))


def _choice(*values: str, optional: bool = False) -> Shape:
    return Shape(
        "one of " + ", ".join(values),
        re.compile("|".join(re.escape(v) for v in values)),
        optional,
    )


INT = Shape("a whole number", re.compile(r"-?\d{1,12}"))
COUNT = Shape("a whole number, or one with k or m", re.compile(r"\d{1,12}[kKmM]?"))
NUMBER = Shape("a number", re.compile(r"-?(\d{1,12}(\.\d*)?|\.\d+)([eE]-?\d{1,3})?"))
# A plain name: no slash, so never a path; no leading dash, so never another flag.
WORD = Shape("a name (letters, digits, . _ : -)", re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,99}"))
LIST = Shape("numbers separated by commas", re.compile(r"\d+(\.\d+)?(,\d+(\.\d+)?){0,63}"))
TEXT = Shape("text that does not start with -", re.compile(r"[^-\x00][^\x00]{0,199}"))
SWITCH = None

_LLAMA_CACHE = _choice("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
_TORCH_DTYPE = _choice("auto", "half", "float16", "bfloat16", "float", "float32")
_LOG_LEVEL = _choice("debug", "info", "warning", "error", "critical", "trace")

ALLOWED_FLAGS: dict[str, dict[str, Shape | None]] = {
    "llamacpp": {
        "--ctx-size": INT,
        "--batch-size": INT,
        "--ubatch-size": INT,
        "--parallel": INT,
        "--n-predict": INT,
        "--keep": INT,
        "--flash-attn": _choice("on", "off", "auto", optional=True),
        "--cont-batching": SWITCH,
        "--no-cont-batching": SWITCH,
        "--cache-type-k": _LLAMA_CACHE,
        "--cache-type-v": _LLAMA_CACHE,
        "--cache-reuse": INT,
        "--defrag-thold": NUMBER,
        # Builds before --load-mode have --mlock and --no-mmap; both are listed.
        "--mlock": SWITCH,
        "--no-mmap": SWITCH,
        "--load-mode": _choice("auto", "none", "mmap", "mlock", "mmap+mlock", "dio"),
        "--numa": _choice("distribute", "isolate", "numactl"),
        "--split-mode": _choice("none", "layer", "row"),
        "--tensor-split": LIST,
        "--main-gpu": INT,
        "--temp": NUMBER,
        "--top-k": INT,
        "--top-p": NUMBER,
        "--min-p": NUMBER,
        "--repeat-penalty": NUMBER,
        "--repeat-last-n": INT,
        "--presence-penalty": NUMBER,
        "--frequency-penalty": NUMBER,
        "--seed": INT,
        "--rope-scaling": _choice("none", "linear", "yarn"),
        "--rope-freq-base": NUMBER,
        "--rope-freq-scale": NUMBER,
        "--jinja": SWITCH,
        "--chat-template": WORD,
        "--reasoning-format": _choice("none", "deepseek", "deepseek-legacy", "auto"),
        "--reasoning-budget": INT,
        "--embedding": SWITCH,
        "--embeddings": SWITCH,
        "--reranking": SWITCH,
        "--pooling": _choice("none", "mean", "cls", "last", "rank"),
        "--kv-unified": SWITCH,
        "--swa-full": SWITCH,
        "--metrics": SWITCH,
        "--timeout": INT,
    },
    "vllm": {
        "--max-model-len": COUNT,
        "--gpu-memory-utilization": NUMBER,
        "--max-num-seqs": INT,
        "--max-num-batched-tokens": COUNT,
        "--dtype": _TORCH_DTYPE,
        "--kv-cache-dtype": _choice("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc"),
        "--quantization": WORD,
        "--enforce-eager": SWITCH,
        "--enable-prefix-caching": SWITCH,
        "--no-enable-prefix-caching": SWITCH,
        "--prefix-caching-hash-algo": _choice("builtin", "sha256", "sha256_cbor"),
        "--enable-chunked-prefill": SWITCH,
        "--no-enable-chunked-prefill": SWITCH,
        "--swap-space": NUMBER,
        "--cpu-offload-gb": NUMBER,
        "--block-size": INT,
        "--seed": INT,
        "--max-logprobs": INT,
        "--max-lora-rank": INT,
        "--trust-remote-code": SWITCH,
        "--revision": WORD,
        "--tokenizer-mode": _choice("auto", "slow", "mistral", "custom"),
        "--generation-config": _choice("auto", "vllm"),
        "--enable-auto-tool-choice": SWITCH,
        "--tool-call-parser": WORD,
        "--reasoning-parser": WORD,
        "--disable-log-requests": SWITCH,
        "--disable-log-stats": SWITCH,
        "--uvicorn-log-level": _LOG_LEVEL,
        "--max-seq-len-to-capture": INT,
    },
    "sglang": {
        "--context-length": INT,
        "--mem-fraction-static": NUMBER,
        "--max-running-requests": INT,
        "--max-total-tokens": INT,
        "--max-prefill-tokens": INT,
        "--chunked-prefill-size": INT,
        "--dtype": _TORCH_DTYPE,
        "--kv-cache-dtype": _choice("auto", "fp8_e5m2", "fp8_e4m3"),
        "--quantization": WORD,
        "--trust-remote-code": SWITCH,
        "--disable-radix-cache": SWITCH,
        "--disable-cuda-graph": SWITCH,
        "--cuda-graph-max-bs": INT,
        "--enable-torch-compile": SWITCH,
        "--schedule-policy": _choice("lpm", "random", "fcfs", "dfs-weight"),
        "--schedule-conservativeness": NUMBER,
        "--attention-backend": WORD,
        "--random-seed": INT,
        "--revision": WORD,
        "--tool-call-parser": WORD,
        "--reasoning-parser": WORD,
        "--stream-interval": INT,
        "--log-level": _LOG_LEVEL,
    },
    "trtllm": {
        "--max_batch_size": INT,
        "--max_num_tokens": INT,
        "--max_seq_len": INT,
        "--max_beam_width": INT,
        "--kv_cache_free_gpu_memory_fraction": NUMBER,
        "--backend": _choice("pytorch", "tensorrt", "_autodeploy"),
        "--trust_remote_code": SWITCH,
        "--reasoning_parser": WORD,
        "--log_level": _choice("internal_error", "error", "warning", "info", "verbose", "debug"),
    },
    "sim": {
        "--ttft": NUMBER,
        "--tps": NUMBER,
        "--load-time": NUMBER,
        "--context-length": INT,
        "--parallel": INT,
        "--logprob-style": _choice("vllm", "llamacpp"),
        "--unsafe-marker": TEXT,
        "--controversial-marker": TEXT,
    },
}

# Environment an operator may set, by engine, besides what every engine may have. Exact
# names: a variable can load code (BASH_ENV, PYTHONWARNINGS naming a module, GCONV_PATH,
# VLLM_PLUGINS), change the C library (GLIBC_TUNABLES, LD_*), point an engine at a key
# (VLLM_API_KEY) or carry the control plane's secrets (LLMGW_*): none of those pass.
_COMMON_ENV = frozenset(
    {
        "OMP_NUM_THREADS",
        "PYTHONHASHSEED",
        "TOKENIZERS_PARALLELISM",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_ENABLE_HF_TRANSFER",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_MODULE_LOADING",
        "NCCL_DEBUG",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_P2P_DISABLE",
        "NCCL_P2P_LEVEL",
        "NCCL_SHM_DISABLE",
        "NCCL_SOCKET_IFNAME",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_CUMEM_ENABLE",
        "NCCL_NVLS_ENABLE",
        "NCCL_ALGO",
        "NCCL_PROTO",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "GLOO_SOCKET_IFNAME",
    }
)
ALLOWED_ENV: dict[str, frozenset[str]] = {
    "llamacpp": frozenset(
        {"GGML_CUDA_ENABLE_UNIFIED_MEMORY", "GGML_CUDA_NO_PINNED", "GGML_SCHED_MAX_COPIES"}
    ),
    "vllm": frozenset(
        {
            "VLLM_LOGGING_LEVEL",
            # Refused by the catalog's rules unless max_loaded_adapters is set.
            RUNTIME_LORA_ENV,
            "VLLM_ATTENTION_BACKEND",
            "VLLM_USE_V1",
            "VLLM_WORKER_MULTIPROC_METHOD",
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
            "VLLM_USE_FLASHINFER_SAMPLER",
            "VLLM_FLASH_ATTN_VERSION",
            "VLLM_ENGINE_ITERATION_TIMEOUT_S",
            "VLLM_RPC_TIMEOUT",
            "VLLM_USE_DEEP_GEMM",
            "VLLM_MARLIN_USE_ATOMIC_ADD",
        }
    ),
    "sglang": frozenset({"SGL_ENABLE_JIT_DEEPGEMM", "SGLANG_LOGGING_LEVEL"}),
    "trtllm": frozenset({"TLLM_LOG_LEVEL"}),
    # The simulator's own settings are LLMGW_SIM_<OPTION> (agent.sim), any but the ones the
    # agent sets on its command line (_SIM_AGENT_ENV).
    "sim": frozenset(),
}
_SIM_ENV = re.compile(r"LLMGW_SIM_[A-Z0-9_]{1,60}")
_SIM_AGENT_ENV = frozenset(
    f"LLMGW_SIM_{o}" for o in ("HOST", "PORT", "MODEL", "GUARD_FORMAT", "GUARD_CATEGORIES")
)
_ENV_DOC = "docs/catalog.md lists what each engine may be given"


def unsafe_env(key: str, engine: str = "", value: str = "") -> str | None:
    """Return why an engine may not be given this environment variable, or None.

    Only the variables of ``_COMMON_ENV`` and the engine's ``ALLOWED_ENV`` pass (``engine``
    empty: those of any engine). ``value`` may not hold a NUL or a line break.
    """
    if not _ENV_NAME.fullmatch(key):
        return "it is not a variable name: use letters, digits and _, not starting with a digit"
    if key == "PATH" or key.startswith("LD_"):
        return "it changes which programs and libraries the engine loads"
    if key in _PYTHON_ENV:
        return "it changes which Python code the engine runs"
    if key in _DEVICE_ENV:
        return "the agent assigns the cards: use gpu_class and gpus_per_node"
    if key in _SIM_AGENT_ENV:
        return "the agent sets the simulator's address, model and guard format"
    sim_own = engine in ("sim", "") and bool(_SIM_ENV.fullmatch(key))
    if key.startswith("LLMGW_") and not sim_own:
        return "it is the control plane's own setting, never an engine's"
    allowed = ALLOWED_ENV.get(engine) if engine else frozenset().union(*ALLOWED_ENV.values())
    if allowed is None:
        return f'engine "{engine}" is not one of {", ".join(ENGINES)}'
    if key not in _COMMON_ENV and key not in allowed and not sim_own:
        for_engine = f" for {engine}" if engine else ""
        return f"it is not one an operator may set{for_engine} ({_ENV_DOC})"
    if "\x00" in value or "\n" in value or len(value) > 1000:
        return "its value must be one line of at most 1000 characters"
    return None


def arg_problems(engine: str, args: Sequence[str]) -> list[str]:
    """Return why an engine may not be started with these arguments: one reason a fault.

    Each argument is a flag of the engine's ``ALLOWED_FLAGS``, exactly (a prefix or a short
    form is refused, as engines' argparse would take it for another flag), written
    ``--flag value`` or ``--flag=value`` for a flag with a value, its value of the flag's
    shape. A flag the agent sets names the catalog field to use instead. An engine outside
    ``ENGINES`` is refused, naming them.
    """
    allowed = ALLOWED_FLAGS.get(engine)
    if allowed is None:
        return [f'engine "{engine}" is not one of {", ".join(ENGINES)}']
    agent = _ENGINE_FLAGS[engine]
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = str(args[i])
        i += 1
        flag, eq, value = arg.partition("=")
        if flag in agent or flag not in allowed:
            if flag in agent:
                out.append(f'argument "{flag}" sets what the agent sets: {agent[flag]}')
            else:
                out.append(_not_allowed(engine, flag, arg, agent))
            if not eq and flag.startswith("-") and i < len(args):
                # Its value, most likely: one fault, not two.
                i += not str(args[i]).startswith("-")
            continue
        shape = allowed[flag]
        if shape is None:
            if eq:
                out.append(f'argument "{flag}" is a switch: write it without "={value}"')
            continue
        if not eq:
            nxt = str(args[i]) if i < len(args) else None
            if nxt is not None and shape.fits(nxt):
                value, i = nxt, i + 1
            elif shape.optional:
                continue
            else:
                given = "nothing" if nxt is None else f'"{nxt[:40]}"'
                out.append(f'argument "{flag}" takes {shape.what}, not {given}')
                if nxt is not None and not nxt.startswith("-"):
                    i += 1
                continue
        if not shape.fits(value):
            out.append(f'argument "{flag}" takes {shape.what}, not "{value[:40]}"')
    return out


def _not_allowed(engine: str, flag: str, arg: str, agent: Mapping[str, str]) -> str:
    if not flag.startswith("-"):
        return f'"{arg[:40]}" is a value with no flag before it: write "--flag value"'
    if flag.startswith("--"):
        longer = sorted(f for f in (*agent, *ALLOWED_FLAGS[engine]) if f.startswith(flag))
        if longer:
            return (
                f'argument "{flag}" is short for "{longer[0]}": write flags in full (an '
                "engine takes a prefix for whichever flag it begins)"
            )
    return (
        f'argument "{flag}" is not one an operator may pass to {engine} (docs/catalog.md '
        "lists them; flags naming files, keys or download sources are the agent's own)"
    )


def unsafe_args(engine: str, args: Sequence[str]) -> str | None:
    """Return the first of ``arg_problems``, or None."""
    problems = arg_problems(engine, args)
    return problems[0] if problems else None


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
# What a catalog may never set, as the agent's own: the key flags and variables above,
# and llama-server's other way to its keys. (The argument checks refuse them: none is in
# ALLOWED_FLAGS or ALLOWED_ENV.)
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
    paths = {a["name"]: (adapters or {}).get(a["name"], a["source"]) for a in _adapters(replica)}
    build = _BUILDERS[engine]
    argv, extra_env, health = build(
        replica, port, weights_path, bins, host, node_address, paths, adapter_dir
    )
    env.update(extra_env)
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


# Arguments that undo what kv_events sets: events published, hashed as the router does.
_KV_FLAGS = frozenset(
    {"--kv-events-config", "--prefix-caching-hash-algo", "--no-enable-prefix-caching"}
)


_Built = tuple[list[str], dict[str, str], str | None]


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
    return argv, env, "/health"


_BUILDERS = {
    "llamacpp": _llamacpp,
    "vllm": _vllm,
    "sglang": _sglang,
    "trtllm": _trtllm,
    "sim": _sim,
}
