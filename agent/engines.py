"""The inference engines the agent runs, and what a catalog may not ask of them.

The catalog's rules call ``unsafe_env`` and ``unsafe_args`` (as the reference's catalog
imports its engines package): the checks live beside the command lines that would run
them, so a flag the agent starts setting is refused in the same change. No Django here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

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
        "--alias": _NAME,
        "-t": _THREADS,
        "--threads": _THREADS,
        "--lora": _LORA,
        "--lora-scaled": _LORA,
    },
    # The simulator is no real engine: catalog.md refuses it nothing.
    "sim": {},
}


def unsafe_env(key: str) -> str | None:
    """Return why an engine may not be given this environment variable, or None."""
    if not _ENV_NAME.fullmatch(key):
        return "it is not a variable name: use letters, digits and _, not starting with a digit"
    if key == "PATH" or key.startswith("LD_"):
        return "it changes which programs and libraries the engine loads"
    if key in _PYTHON_ENV:
        return "it changes which Python code the engine runs"
    if key in _DEVICE_ENV:
        return "the agent assigns the cards: use gpu_class and gpus_per_node"
    return None


def unsafe_args(engine: str, args: Sequence[str]) -> str | None:
    """Return why an engine may not be started with these arguments, or None.

    An argument is refused when it sets what the agent itself sets, written either
    ``--flag value`` or ``--flag=value``. The reason names the argument and the catalog
    field to use instead. An engine outside ``ENGINES`` is refused, naming them.
    """
    flags = _ENGINE_FLAGS.get(engine)
    if flags is None:
        return f'engine "{engine}" is not one of {", ".join(ENGINES)}'
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in flags:
            return f'argument "{flag}" sets what the agent sets: {flags[flag]}'
    return None
