"""What a catalog may hand each engine: its flags and environment, by the engine's own tables.

Each engine's table (``<engine>.json`` beside this file) lists every flag its own parser
takes at the versions recorded in it, with its aliases, whether it takes a value and
whether it may be given twice; ``scripts/engine-flags.py`` regenerates them from the
engines' sources. This module decides what each flag is to the catalog, in three kinds:

- the agent's own (``AGENT``): what the agent sets itself (address, port, the model and
  its served name, tp, pp, nodes, threads, adapters, the per-replica API key), refused
  naming the catalog field to use instead;
- one that names a file, folder, URL, address, key, download source or code to load
  (``names_a_thing``): refused, as the engine would read or fetch what it names;
- one that runs code, opens a tool endpoint, widens who may call the engine or changes
  where its weights come from, whatever its value (``REFUSED``, read by hand from each
  engine's documentation): refused saying which;
- everything else: allowed, exactly as spelled in the table.

A flag that is not in the table (an abbreviation, which argparse would take for the flag
it begins, or a typo) is refused naming the nearest real flag; a flag given twice is
refused unless the engine repeats it (otherwise the last one silently wins).

Environment variables: refused are those that load code, name files, folders or addresses,
carry keys, or are the agent's or the control plane's own (``unsafe_env``); engines read
hundreds (``NCCL_*``, ``CUDA_*``, ``VLLM_*``, ``TORCH_*``), so any other passes, and one the
engine does not document (nor ``COMMON_ENV`` lists) is passed with a warning
(``env_warning``): a typo the engine would ignore. No Django here.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ENGINES = ("vllm", "sglang", "llamacpp", "trtllm", "sim")
_HERE = Path(__file__).resolve().parent

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
_KEY = (
    "the agent gives each replica its own key, which the gateway and the guard send; "
    "another would lock them out"
)
_TRUST = (
    "set the model's trust_remote_code: true instead, on purpose: the engine then imports "
    "and runs the Python files that come with the model (its page shows it, and a change "
    "to those files counts as an update)"
)

# The agent's own flags, by one of their names: every alias of that flag in the engine's
# table is the agent's too.
AGENT: dict[str, dict[str, str]] = {
    "vllm": {
        "--host": _PORT,
        "--port": _PORT,
        "--api-key": _KEY,
        "--model": _SOURCE,
        "--served-model-name": _NAME,
        "--tensor-parallel-size": _TP,
        "--pipeline-parallel-size": _PP,
        "--nnodes": _NODES,
        "--node-rank": _NODES,
        "--master-addr": _NODES,
        "--master-port": _NODES,
        "--headless": _NODES,
        "--distributed-executor-backend": _NODES,
        "--lora-modules": _LORA,
        "--trust-remote-code": _TRUST,
    },
    "sglang": {
        "--host": _PORT,
        "--port": _PORT,
        "--api-key": _KEY,
        "--model-path": _SOURCE,
        "--served-model-name": _NAME,
        "--tp-size": _TP,
        "--pp-size": _PP,
        "--nnodes": _NODES,
        "--node-rank": _NODES,
        "--dist-init-addr": _NODES,
        "--lora-paths": _LORA,
        "--trust-remote-code": _TRUST,
    },
    "llamacpp": {
        "--host": _PORT,
        "--port": _PORT,
        "--api-key": _KEY,
        "--model": _SOURCE,
        "--alias": _NAME,
        "--threads": _THREADS,
        "--lora": _LORA,
        "--lora-scaled": _LORA,
    },
    "trtllm": {
        "--host": _PORT,
        "--port": _PORT,
        "--tensor_parallel_size": _TP,
        "--pipeline_parallel_size": _PP,
        "--trust_remote_code": _TRUST,
    },
    "sim": {
        "--host": _PORT,
        "--port": _PORT,
        "--model": _NAME,
        "--api-key": _KEY,
        "--guard-format": _GUARD,
        "--guard-categories": _GUARD,
        "--weights": _SOURCE,
    },
}

# Flags refused whatever their value: what runs code on the node, opens an endpoint that
# does, widens who may call the engine, or changes where its weights come from (each read
# in the engine's own documentation; docs/catalog.md lists them with why).
_RUNS = "it runs code or commands on the node that the catalog does not vet"
_TOOLS = (
    "it opens llama-server's /tools endpoint, which runs shell commands and writes files on "
    "the node for whoever holds the replica's key"
)
_MCP = "it starts the MCP servers it names: programs run on the node as the agent's user"
_MCP_PROXY = "it opens a proxy endpoint through which a caller reaches any address the node can"
_CORS = (
    "it widens who may call the engine (CORS lets web pages in browsers call it): only the "
    "gateway and the guard call a replica"
)
_GRPC = (
    "it serves gRPC instead of the OpenAI HTTP API, without the replica's key: anyone who "
    "reaches the port could call the engine"
)
_PRESET = (
    "it downloads a fixed model from Hugging Face instead of the model's source: the "
    "model's source is where weights come from"
)
_FETCHES = (
    "it changes where the engine's weights come from: the model's source (mirrored) is "
    "where they come from"
)
_REQUEST_CODE = "it lets a request make the engine import or run code the request names or carries"
_REQUEST_TEMPLATE = (
    "it lets a request hand the engine its own chat template to run in place of the model's"
)
_PICKLE = (
    "the engine then deserialises tensors a request sends (torch.load), a known way to run "
    "code on the node (CVE-2025-62164)"
)
REFUSED: dict[str, dict[str, str]] = {
    "vllm": {
        "--grpc": _GRPC,
        "--allow-credentials": _CORS,
        "--allowed-headers": _CORS,
        "--allowed-methods": _CORS,
        "--logits-processor-pattern": _REQUEST_CODE,
        "--trust-request-chat-template": _REQUEST_TEMPLATE,
        "--enable-prompt-embeds": _PICKLE,
        "--code-revision": (
            "it picks another commit's model code from the Hub for the engine to run; the "
            "model's source and origin say which files are used"
        ),
    },
    "sglang": {
        "--grpc-mode": _GRPC,
        "--smg-grpc-mode": _GRPC,
        "--enable-custom-logit-processor": (
            "it lets a request send a serialised logit processor that the engine loads and "
            "runs (pickle): any caller runs code on the node"
        ),
        "--forward-hooks": "it imports and runs the hook factories it names by Python path",
        "--custom-weight-loader": "it imports and runs the loaders it names by Python path",
        "--sidecar": _RUNS,
        "--sidecar-args": _RUNS,
        "--trust-request-chat-template": _REQUEST_TEMPLATE,
        "--remote-instance-weight-loader-backend": _FETCHES,
        "--remote-instance-weight-loader-start-seed-via-transfer-engine": _FETCHES,
        "--modelexpress-config": _FETCHES,
    },
    "llamacpp": {
        "--tools": _TOOLS,
        "--tools-runtime": (
            "it sets where llama-server's /tools run their commands (ssh:HOST reaches "
            "another machine)"
        ),
        "--mcp-servers-config": _MCP,
        "--mcp-servers-json": _MCP,
        "--ui-mcp-proxy": _MCP_PROXY,
        "--cors-origins": _CORS,
        "--cors-credentials": _CORS,
        "--cors-headers": _CORS,
        "--cors-methods": _CORS,
        **dict.fromkeys(
            (
                "--embd-bge-small-en-default",
                "--embd-e5-small-en-default",
                "--embd-gemma-default",
                "--embd-gte-small-default",
                "--fim-qwen-1.5b-default",
                "--fim-qwen-3b-default",
                "--fim-qwen-7b-default",
                "--fim-qwen-7b-spec",
                "--fim-qwen-14b-spec",
                "--fim-qwen-30b-default",
                "--gpt-oss-20b-default",
                "--gpt-oss-120b-default",
                "--vision-gemma-4b-default",
                "--vision-gemma-12b-default",
            ),
            _PRESET,
        ),
    },
    "trtllm": {},
    "sim": {},
}
# A flag whose value may be one of these words and names a file or folder otherwise.
WORDS_ONLY: dict[str, dict[str, frozenset[str]]] = {
    "vllm": {"--generation-config": frozenset({"auto", "vllm"})},
    "sglang": {"--init-expert-location": frozenset({"trivial"})},
}
# A flag whose value is a repository id (a tokenizer's), never a path or URL: the model's
# own source is handed to the engine as its local copy (agent.engines.command_for); another
# the engine fetches as it fetches a source given as an id.
REPO_ID_FLAGS: dict[str, frozenset[str]] = {
    "vllm": frozenset({"--tokenizer"}),
    "sglang": frozenset({"--tokenizer-path"}),
}
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")

# A flag taking a value names a thing the engine would open, fetch, connect to or import
# when its last word (split at - and _) is one of these, or any word is a strong one.
_THING_WORDS = frozenset(
    {
        "file", "files", "path", "paths", "dir", "dirs", "folder", "root",
        "url", "urls", "uri", "host", "hosts", "port", "ports", "addr", "address", "ip",
        "key", "keys", "token", "secret", "password", "ssl", "cert", "certfile", "keyfile",
        "certs", "endpoint", "endpoints", "socket", "uds", "rpc", "server", "servers",
        "domain", "domains", "download", "repo", "hf", "mirror", "registry",
        "plugin", "plugins", "module", "modules", "cls", "class", "middleware",
        "tokenizer", "mmproj", "vocoder", "import", "model",
    }
)  # fmt: skip
_STRONG_WORDS = frozenset(
    {
        "file", "files", "path", "paths", "dir", "dirs", "folder", "url", "urls", "uri",
        "ssl", "certfile", "keyfile", "endpoint", "endpoints", "socket", "uds", "plugin",
        "plugins", "middleware", "download", "hf", "password", "secret",
    }
)  # fmt: skip
# Flags whose words say otherwise but name nothing (checked by reading their help).
_NOT_THINGS = frozenset(
    {
        "--hf-overrides",  # model config values as JSON
        "--tokenizer-mode",
        "--tokenizer-pool-size",
        "--tokenizer-worker-num",
        "--skip-tokenizer-init",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--prefix-caching-hash-algo",
        "--log-prefix",
        "--lora-target-modules",
        "--bucket-time-to-first-token",
        "--kt-max-deferred-experts-per-token",
        "--mamba-max-states-per-path",
        "--media-url-max-file-size-mb",
        "--grammar-backend",
        "--log-prefix-stats",
        "--disable-radix-cache",
        "--draft-max",
        "--draft-min",
        "--draft-p-min",
        "--draft-p-split",
        "--spec-draft-n-max",
        "--spec-draft-n-min",
        "--spec-draft-p-min",
        "--spec-draft-p-split",
        "--gpu-layers-draft",
        "--n-gpu-layers-draft",
        "--ctx-size-draft",
        "--threads-draft",
        "--threads-batch-draft",
        "--cache-type-k-draft",
        "--cache-type-v-draft",
        "--device-draft",
        "--override-tensor-draft",
        "--cpu-moe-draft",
        "--n-cpu-moe-draft",
    }
)
# Flags that name a thing though their words do not say so.
_THINGS: dict[str, frozenset[str]] = {
    "vllm": frozenset(
        {
            "--config",
            "--chat-template",
            "--speculative-model",
            "--kv-transfer-config",
            "--kv-events-config",
            "--ec-transfer-config",
            "--logits-processors",
            "--allowed-origins",
            "--qlora-adapter-name-or-path",
            "--structured-outputs-config",
            "--model-loader-extra-config",
            "--lora-resolver-config",
            "--weight-transfer-config",
            "--default-mm-loras",  # {"image": "/path/to/lora"}
        }
    ),
    "sglang": frozenset(
        {
            "--config",
            "--chat-template",
            "--completion-template",
            "--speculative-token-map",
            "--dllm-algorithm-config",
            "--msprobe-dump-config",
        }
    ),
    "llamacpp": frozenset(
        {
            "--model-draft",
            "--control-vector",
            "--control-vector-scaled",
            "--override-kv",
            "--chat-template-file",
            "--lookup-cache-static",
            "--lookup-cache-dynamic",
            "--api-key-file",
            "--models-preset",
            "--webui-config",
            "--webui-config-file",
        }
    ),
    "trtllm": frozenset({"--config", "--chat_template", "--custom_tokenizer"}),
    "sim": frozenset(),
}
_THING = (
    "it names a file, folder, URL, address, key, download source or code to load, which "
    "the engine would open, fetch or import as the agent's user; the model's source, "
    "adapters and the node's weights folders are where those come from"
)
# Keys of a JSON value that name such a thing (--speculative-config's "model").
_JSON_THING = re.compile(
    r"(^|_)(model|path|paths|file|dir|url|uri|host|port|addr|address|endpoint|key|token|"
    r"tokenizer|plugin|module|cls)(_|$)",
    re.IGNORECASE,
)

# A flag whose name ends so takes settings, as JSON or (for some) a file's path.
_CONFIG_FLAG = re.compile(r"[-_](config|kwargs|overrides)$")
_FILE_SUFFIX = re.compile(r"\.(json|ya?ml|toml|py|txt|cfg|ini|pt|bin)$", re.IGNORECASE)
# Keys of a JSON value whose string names code to import (CompilationConfig's "backend",
# a hook's "hook_factory", a pass): refused when the value is a dotted import path.
_JSON_CODE = re.compile(
    r"(^|_)(backend|factory|hook|hooks|pass|passes|processor|processors|loader|fn|func|"
    r"function|callable|class|impl)(_|$)",
    re.IGNORECASE,
)
_QUALNAME = re.compile(
    r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?|[A-Za-z_]\w*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*"
)

# Environment: the common runtime variables any engine may have.
COMMON_ENV = frozenset(
    {
        "OMP_NUM_THREADS",
        "OMP_PROC_BIND",
        "OMP_PLACES",
        "OMP_WAIT_POLICY",
        "OMP_SCHEDULE",
        "OMP_DYNAMIC",
        "OMP_MAX_ACTIVE_LEVELS",
        "OMP_STACKSIZE",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "KMP_AFFINITY",
        "KMP_BLOCKTIME",
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "TOKENIZERS_PARALLELISM",
        "HF_HUB_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HUB_DISABLE_TELEMETRY",
        "HF_HUB_ENABLE_HF_TRANSFER",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        "PYTORCH_CUDA_ALLOC_CONF",
        "PYTORCH_NVML_BASED_CUDA_CHECK",
        "TORCH_CUDA_ARCH_LIST",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "CUDA_LAUNCH_BLOCKING",
        "CUDA_DEVICE_MAX_CONNECTIONS",
        "CUDA_DEVICE_ORDER",
        "CUDA_MODULE_LOADING",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "NCCL_IB_TIMEOUT",
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
        "NCCL_BUFFSIZE",
        "NCCL_LAUNCH_MODE",
        "GLOO_SOCKET_IFNAME",
        "GGML_CUDA_ENABLE_UNIFIED_MEMORY",
        "GGML_CUDA_NO_PINNED",
        "GGML_SCHED_MAX_COPIES",
        "TLLM_LOG_LEVEL",
    }
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# PYTHON* variables that choose no code (every other one does: PYTHONPATH, PYTHONSTARTUP,
# PYTHONWARNINGS and PYTHONBREAKPOINT import modules, PYTHONINSPECT opens a prompt).
_PYTHON_HARMLESS = frozenset(
    {
        "PYTHONHASHSEED",
        "PYTHONUNBUFFERED",
        "PYTHONDONTWRITEBYTECODE",
        "PYTHONFAULTHANDLER",
        "PYTHONIOENCODING",
        "PYTHONUTF8",
    }
)
# Variables that make a shell or another runtime the engine may start load code.
_LOADER_ENV = frozenset(
    {
        "BASH_ENV",
        "ENV",
        "SHELLOPTS",
        "BASHOPTS",
        "PS4",
        "NODE_OPTIONS",
        "PERL5OPT",
        "PERL5LIB",
        "RUBYOPT",
        "RUBYLIB",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "JDK_JAVA_OPTIONS",
    }
)
# Engine variables refused by name, with why (each read in the engine's documentation).
_ENV_REFUSED: dict[str, str] = {
    "VLLM_ALLOW_INSECURE_SERIALIZATION": (
        "it lets vLLM's processes unpickle what they exchange, a way to run code on the node"
    ),
    "VLLM_USE_MODELSCOPE": (
        "it makes the engine fetch weights from ModelScope instead of the model's source"
    ),
    "SGLANG_USE_MODELSCOPE": (
        "it makes the engine fetch weights from ModelScope instead of the model's source"
    ),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": (
        "the agent sets it for a model that loads adapters on demand: set the model's "
        "max_loaded_adapters instead (by hand it opens an endpoint that loads an adapter "
        "from any path or repository a caller names)"
    ),
    "VLLM_SERVER_DEV_MODE": (
        "it opens vLLM's development endpoints (/collective_rpc calls any method of the "
        "engine's workers, /reset_prefix_cache, /sleep) to whoever holds the replica's key"
    ),
}
_DEVICE_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "ROCR_VISIBLE_DEVICES",
    }
)
# Words of a variable's name that say it names a thing, loads code or holds a key.
_ENV_THING_WORDS = frozenset(
    {
        "PATH", "PATHS", "FILE", "FILES", "DIR", "DIRS", "ROOT", "HOME", "URL", "URLS",
        "URI", "HOST", "HOSTS", "PORT", "PORTS", "ADDR", "ADDRESS", "IP", "KEY", "KEYS",
        "TOKEN", "SECRET", "PASSWORD", "CERT", "ENDPOINT", "ENDPOINTS", "SOCKET", "SERVER",
        "PLUGIN", "PLUGINS", "MODULE", "MODULES", "CLS", "CLASS", "REPO", "MIRROR",
        "DOMAIN", "DOMAINS", "PROXY", "CACHE", "CONFIG", "PRELOAD", "LIB", "LIBRARY",
        "ENTRYPOINT", "ENTRYPOINTS", "COMMAND", "CMD", "EXEC", "SCRIPT", "WEBHOOK",
        "MODELSCOPE",
    }
)  # fmt: skip
# How a name glued without "_" ends when it names a thing (XPATH, CLASSPATH, HFHOME).
_ENV_THING_ENDS = (
    "PATH", "PATHS", "DIR", "DIRS", "FILE", "FILES", "HOME", "ROOT", "URL", "URI", "KEY",
    "TOKEN", "SECRET", "PASSWORD", "PRELOAD", "PLUGIN", "PLUGINS", "ENDPOINT", "PROXY",
)  # fmt: skip
# A variable the engine sets itself from a flag: it is what that flag is (LLAMA_ARG_*).
_SIM_AGENT_ENV = frozenset(
    f"LLMGW_SIM_{o}"
    for o in ("HOST", "PORT", "MODEL", "API_KEY", "GUARD_FORMAT", "GUARD_CATEGORIES")
)


@dataclass(frozen=True)
class Flag:
    """One flag of an engine's table: its names (the first is its own), how it takes a
    value (none, one, optional, many, two) and whether it may be given twice."""

    names: tuple[str, ...]
    value: str
    repeat: bool


@dataclass(frozen=True)
class Table:
    """An engine's flags and environment as its own parser takes them."""

    engine: str
    program: str
    versions: tuple[str, ...]
    source: str
    underscores: bool  # --a_b is read as --a-b
    equals: bool  # --flag=value is read
    flags: Mapping[str, Flag]
    env: frozenset[str]
    env_flags: Mapping[str, str]  # a variable the engine reads as a flag

    def flag(self, name: str) -> Flag | None:
        """Return the flag a name (as written) is, or None."""
        if self.underscores and name.startswith("--"):
            name = name.replace("_", "-")
        return self.flags.get(name)


@cache
def table(engine: str) -> Table:
    """Return an engine's table, read from its JSON file once."""
    data = json.loads((_HERE / f"{engine}.json").read_text(encoding="utf-8"))
    flags: dict[str, Flag] = {}
    for f in data["flags"]:
        flag = Flag(tuple(f["names"]), f["value"], bool(f["repeat"]))
        for name in flag.names:
            flags.setdefault(name, flag)
    return Table(
        engine=engine,
        program=data["program"],
        versions=tuple(data["versions"]),
        source=data["source"],
        underscores=bool(data.get("underscores")),
        equals=bool(data.get("equals", True)),
        flags=flags,
        env=frozenset(data.get("env", ())),
        env_flags={e["name"]: e["flag"] for e in data.get("env_flags", ())},
    )


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[-_.]+", name.lower()) if w]


def _names_a_thing(name: str) -> bool:
    words = _words(name)
    return bool(words) and (words[-1] in _THING_WORDS or bool(set(words) & _STRONG_WORDS))


@cache
def kinds(engine: str) -> dict[str, str]:
    """Return each flag name of an engine that is refused, with why (the agent's own,
    or one naming a thing); a name missing here is allowed."""
    t = table(engine)
    out: dict[str, str] = {}
    agent = AGENT[engine]
    for flag in set(t.flags.values()):
        why = next(
            (
                f"it sets what the agent sets: {agent[n]}"
                for n in flag.names
                if n in agent or (t.underscores and n.replace("_", "-") in agent)
            ),
            None,
        )
        if why is None:
            why = next((REFUSED[engine][n] for n in flag.names if n in REFUSED[engine]), None)
        if why is None and any(n in REPO_ID_FLAGS.get(engine, ()) for n in flag.names):
            continue  # its value is checked: a repository id
        if why is None:
            thing = any(n in _THINGS[engine] for n in flag.names) or (
                flag.value != "none"
                and not any(n in _NOT_THINGS for n in flag.names)
                and any(_names_a_thing(n) for n in flag.names)
            )
            if thing:
                why = _THING
        if why:
            for n in flag.names:
                out[n] = why
    return out


def _nearest(engine: str, flag: str) -> str:
    t = table(engine)
    names = sorted(t.flags)
    longer = [n for n in names if n.startswith(flag) and flag.startswith("--")]
    if longer:
        return f'"{flag}" is short for "{min(longer, key=len)}": write flags in full'
    close = difflib.get_close_matches(flag, names, n=1, cutoff=0.6)
    if close:
        return f'"{flag}" is not a flag of {t.program}: did you mean "{close[0]}"?'
    return f'"{flag}" is not a flag of {t.program} ({_versions(t)})'


def _versions(t: Table) -> str:
    return "versions " + ", ".join(t.versions)


def _looks_like_flag(value: str) -> bool:
    return value.startswith("-") and not re.fullmatch(r"-\d+(\.\d*)?([eE]-?\d+)?", value)


def _value_problem(engine: str, flag: Flag, name: str, value: str) -> str | None:
    if "\x00" in value or "\n" in value or "\r" in value:
        return f'the value of "{name}" must be one line'
    stripped = value.strip()
    if any(n in REPO_ID_FLAGS.get(engine, ()) for n in flag.names) and (
        not _REPO_ID.fullmatch(stripped) or ".." in stripped
    ):
        return (
            f'the value of "{name}" must be a repository id (owner/name), as a model\'s '
            "source may be: a path or URL names a file or address the engine would read "
            "or fetch as the agent's user"
        )
    words = next((w for n, w in WORDS_ONLY.get(engine, {}).items() if n in flag.names), None)
    if words is not None and stripped not in words:
        return (
            f'the value of "{name}" may be {" or ".join(sorted(words))}: another names a '
            "file or folder the engine would read as the agent's user"
        )
    if (
        stripped[:1] not in "{["
        and _CONFIG_FLAG.search(flag.names[0])
        and _looks_like_path(stripped)
    ):
        return (
            f'the value of "{name}" names a file ({_THING.split(", which")[0][3:]}): give '
            "the settings themselves, as JSON"
        )
    if stripped[:1] in "{[":
        try:
            data = json.loads(stripped)
        except ValueError:
            return None  # the engine says what is wrong with its JSON
        found = _json_thing(data)
        if found:
            return (
                f'the value of "{name}" names a {found} ({_THING.split(", which")[0][3:]}): '
                "give the engine no file, URL or model to fetch here"
            )
    return None


def _looks_like_path(value: str) -> bool:
    return "/" in value or "\\" in value or bool(_FILE_SUFFIX.search(value))


def _json_thing(data: object) -> str | None:
    if isinstance(data, dict):
        for key, value in data.items():
            if _JSON_THING.search(str(key)) and value not in (None, "", False):
                return f'"{key}"'
            if (
                _JSON_CODE.search(str(key))
                and isinstance(value, str)
                and _QUALNAME.fullmatch(value.strip())
            ):
                return f'"{key}" (Python code by its import path)'
            found = _json_thing(value)
            if found:
                return found
    elif isinstance(data, list):
        for value in data:
            found = _json_thing(value)
            if found:
                return found
    return None


def arg_problems(engine: str, args: Sequence[str]) -> list[str]:
    """Return why an engine may not be started with these arguments: one reason a fault.

    Each flag is one of the engine's table, written as its parser reads it (``--flag
    value``, or ``--flag=value`` where the engine reads that), neither the agent's own
    nor one naming a thing, given once unless the engine repeats it, its values present.
    """
    if engine not in ENGINES:
        return [f'engine "{engine}" is not one of {", ".join(ENGINES)}']
    t = table(engine)
    refused = kinds(engine)
    out: list[str] = []
    seen: dict[Flag, str] = {}
    i = 0
    args = [str(a) for a in args]
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("-") or arg == "-":
            out.append(f'"{arg[:40]}" is a value with no flag before it: write "--flag value"')
            continue
        name, eq, value = arg.partition("=")
        flag = t.flag(name)
        if flag is None:
            out.append(f"argument {_nearest(engine, name)}")
            if not eq and i < len(args) and not _looks_like_flag(args[i]):
                i += 1  # its value, most likely: one fault, not two
            continue
        why = refused.get(name) or refused.get(flag.names[0])
        if why:
            out.append(f'argument "{name}" is not allowed: {why}')
            if not eq and flag.value != "none" and i < len(args) and not _looks_like_flag(args[i]):
                i += 1
            continue
        if flag in seen and not flag.repeat:
            twice = f'"{seen[flag]}" and "{name}"' if seen[flag] != name else f'"{name}"'
            out.append(
                f"argument {twice} given twice: {t.program} keeps only the last; give it once"
            )
        seen.setdefault(flag, name)
        values: list[str] = []
        if eq:
            if flag.value == "none":
                out.append(f'argument "{name}" is a switch: write it without "={value[:40]}"')
                continue
            if not t.equals:
                out.append(
                    f'argument "{arg[:60]}": {t.program} does not read "--flag=value": '
                    f'write "{name}" and "{value[:40]}" as two arguments'
                )
                continue
            values = [value]
        elif flag.value in ("one", "two"):
            need = 2 if flag.value == "two" else 1
            while len(values) < need and i < len(args) and not _looks_like_flag(args[i]):
                values.append(args[i])
                i += 1
            if len(values) < need:
                out.append(f'argument "{name}" takes a value: write "{name} VALUE"')
                continue
        elif flag.value == "optional":
            if i < len(args) and not _looks_like_flag(args[i]):
                values.append(args[i])
                i += 1
        elif flag.value == "many":
            while i < len(args) and not _looks_like_flag(args[i]):
                values.append(args[i])
                i += 1
            if not values:
                out.append(f'argument "{name}" takes one or more values')
                continue
        for v in values:
            if why := _value_problem(engine, flag, name, v):
                out.append(why)
                break
    return out


def unsafe_args(engine: str, args: Sequence[str]) -> str | None:
    """Return the first of ``arg_problems``, or None."""
    problems = arg_problems(engine, args)
    return problems[0] if problems else None


def spelled(engine: str, args: Sequence[str]) -> list[str]:
    """Return the arguments as the engine reads them: ``--flag=value`` split in two for an
    engine that does not read that form (llama-server)."""
    if engine not in ENGINES or table(engine).equals:
        return [str(a) for a in args]
    out: list[str] = []
    t = table(engine)
    for a in args:
        a = str(a)
        name, eq, value = a.partition("=")
        flag = t.flag(name) if a.startswith("--") and eq else None
        out += [name, value] if flag is not None and flag.value != "none" else [a]
    return out


def env_allowed(engine: str) -> frozenset[str]:
    """Return the variables an engine may be given (``engine`` empty: any engine's)."""
    engines = [engine] if engine else list(ENGINES)
    names = set(COMMON_ENV)
    for e in engines:
        names |= table(e).env
    return frozenset(names)


def unsafe_env(key: str, engine: str = "", value: str = "") -> str | None:
    """Return why an engine may not be given this environment variable, or None.

    ``engine`` empty: a variable any engine may have passes. ``value`` may not hold a
    NUL or a line break.
    """
    if not _ENV_NAME.fullmatch(key):
        return "it is not a variable name: use letters, digits and _, not starting with a digit"
    upper = key.upper()
    if upper == "PATH" or upper.startswith("LD_"):
        return "it changes which programs and libraries the engine loads"
    if key.startswith("PYTHON") and key not in _PYTHON_HARMLESS:
        return "it changes which Python code the engine runs"
    if key in _LOADER_ENV or key.startswith("BASH_FUNC_"):
        return "it makes a shell or runtime the engine starts load code"
    if upper == "GLIBC_TUNABLES":
        return (
            "it changes how the C library behaves in every program the engine starts (it "
            "was the way in of CVE-2023-4911)"
        )
    if "TRUST_REMOTE_CODE" in key:
        return (
            "set the model's trust_remote_code: true instead, on purpose: the engine then "
            "runs the Python files that come with the model"
        )
    if key in _ENV_REFUSED:
        return _ENV_REFUSED[key]
    if key in _DEVICE_ENV:
        return "the agent assigns the cards: use gpu_class and gpus_per_node"
    if key in _SIM_AGENT_ENV:
        return "the agent sets the simulator's address, model, key and guard format"
    if engine and engine not in ENGINES:
        return f'engine "{engine}" is not one of {", ".join(ENGINES)}'
    sim_own = engine in ("sim", "") and key.startswith("LLMGW_SIM_")
    if key.startswith("LLMGW_") and not sim_own:
        return "it is the control plane's own setting, never an engine's"
    for e in [engine] if engine else ENGINES:
        flag = table(e).env_flags.get(key)
        if flag and (why := kinds(e).get(flag)):
            return f"it is {flag}'s variable, and {why}"
    thing = set(upper.split("_")) & _ENV_THING_WORDS or upper.endswith(_ENV_THING_ENDS)
    if thing and key not in COMMON_ENV:
        return (
            "it names a file, folder, address, key or code to load, which the engine would "
            "open or import as the agent's user"
        )
    if "\x00" in value or "\n" in value or "\r" in value or len(value) > 1000:
        return "its value must be one line of at most 1000 characters"
    return None


def env_warning(key: str, engine: str) -> str | None:
    """Return why a variable ``unsafe_env`` passes may not do what is meant, or None: one
    the engine does not document (nor is a common runtime one) is passed as written, and
    the engine may never read it (a misspelling, a lower-case name)."""
    if engine not in ENGINES or unsafe_env(key, engine) is not None:
        return None
    if key in env_allowed(engine) or (engine == "sim" and key.startswith("LLMGW_SIM_")):
        return None
    t = table(engine)
    close = difflib.get_close_matches(key.upper(), sorted(env_allowed(engine)), n=1, cutoff=0.8)
    hint = f': did you mean "{close[0]}"?' if close and close[0] != key else ""
    return (
        f"{key} is not a variable {t.program} documents ({_versions(t)}) nor a common runtime "
        f"one: it is passed as written, and the engine may not read it{hint}"
    )
