"""The sim engine's configuration and its command line (``python -m agent.sim --help``).

Standard library only; no Django.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent import simweights

SIM_VERSION = "1"

GUARD_FORMATS = ("qwen3guard", "llamaguard3", "shieldgemma", "json")
LOGPROB_STYLES = ("vllm", "llamacpp")

# vLLM refuses more (its --max-logprobs default); llama-server has no such limit, but a
# client asking for more than vLLM gives is not portable.
MAX_LOGPROBS = 20


# ---------------------------------------------------------------------------------------
# Configuration


@dataclass(frozen=True)
class Config:
    """What the sim serves and how fast."""

    model: str
    host: str = "127.0.0.1"
    port: int = 8080
    ttft: float = 0.2
    tps: float = 50.0
    load_time: float = 0.0
    context_length: int = 4096
    parallel: int = 4
    # How a batch slows as it fills: each request generating beside another stretches a
    # new request's TTFT and time per token by this fraction (0: not at all).
    slowdown: float = 0.0
    logprob_style: str = "vllm"
    guard_format: str | None = None
    guard_categories: tuple[str, ...] = ()
    unsafe_marker: str = "UNSAFE-MARKER"
    controversial_marker: str = "CONTROVERSIAL-MARKER"
    # Every Nth generation request answers 500, as a broken engine would (0: none).
    fail_every: int = 0
    # Asked of every request but /health's as "Authorization: Bearer <key>" ("": none).
    api_key: str = ""
    # How good the model is, read from --weights (agent.simweights); None: a plain sim.
    weights: simweights.Weights | None = None
    # Tokens of prompt prefixes kept in the prefix cache (agent.simcache); 0: no cache,
    # and usage then says nothing of cached tokens, as an engine without one.
    prefix_cache_tokens: int = 65536


# ---------------------------------------------------------------------------------------
# Command line


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative number")
    return value


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a non-negative integer")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text} is not a port (0 picks a free one)")
    return value


def build_parser() -> argparse.ArgumentParser:
    """Return the command line parser; every option falls back to LLMGW_SIM_<OPTION>."""
    parser = argparse.ArgumentParser(
        prog="python -m agent.sim",
        description=(
            "Serve a simulated OpenAI-compatible engine (llama-server/vLLM-like) that writes "
            "synthetic text at a set speed, or answers as a guard model. No weights needed."
        ),
    )

    def option(flag: str, help_text: str, **kwargs: Any) -> None:
        env = "LLMGW_SIM_" + flag.lstrip("-").replace("-", "_").upper()
        if os.environ.get(env):
            # argparse converts a string default with the option's type.
            kwargs["default"] = os.environ[env]
            kwargs.pop("required", None)
        parser.add_argument(flag, help=f"{help_text} (env {env})", **kwargs)

    option("--host", "address to listen on (default %(default)s)", default="127.0.0.1")
    option(
        "--port",
        "port to listen on; 0 picks a free one (default %(default)s)",
        type=_port,
        default=8080,
    )
    option("--model", "the model id it serves", required=True)
    option(
        "--ttft",
        "seconds to the first token (default %(default)s)",
        type=_non_negative,
        default=0.2,
    )
    option(
        "--tps",
        "tokens per second after the first (default %(default)s)",
        type=_positive,
        default=50.0,
    )
    option(
        "--load-time",
        "seconds /health answers 503 Loading model after start (default %(default)s)",
        type=_non_negative,
        default=0.0,
    )
    option(
        "--context-length",
        "context window in tokens (default %(default)s)",
        type=_positive_int,
        default=4096,
    )
    option(
        "--parallel",
        "requests generated at once; more wait their turn (default %(default)s)",
        type=_positive_int,
        default=4,
    )
    option(
        "--slowdown",
        "how a batch slows as it fills: each request generating beside another stretches a "
        "new one's TTFT and time per token by this fraction (default %(default)s)",
        type=_non_negative,
        default=0.0,
    )
    option(
        "--logprob-style",
        "shape of /v1/completions logprobs: vllm (OpenAI legacy) or llamacpp (default %(default)s)",
        default="vllm",
    )
    option("--guard-format", f"answer as a guard model: {', '.join(GUARD_FORMATS)}", default=None)
    option(
        "--guard-categories",
        'comma-separated categories, the first used when unsafe, as "A,B"',
        default="",
    )
    option(
        "--unsafe-marker",
        "judged text holding this is unsafe (default %(default)s)",
        default="UNSAFE-MARKER",
    )
    option(
        "--controversial-marker",
        "qwen3guard: judged text holding this is Controversial (default %(default)s)",
        default="CONTROVERSIAL-MARKER",
    )
    option(
        "--fail-every",
        "answer 500 to every Nth generation request, as a broken engine would; 0: never "
        "(default %(default)s)",
        type=_non_negative_int,
        default=0,
    )
    option(
        "--api-key",
        "answer only requests with Authorization: Bearer KEY (all but /health), others 401; "
        "the agent passes it in the environment, so ps does not show it",
        default="",
    )
    option(
        "--weights",
        "a sim weights file (or a folder holding sim-weights.json) saying how well it "
        "answers: docs/updates.md; a file that is none (a real model's) is ignored",
        default="",
    )
    option(
        "--prefix-cache-tokens",
        "tokens of served prompts and answers kept in the prefix cache, reported as usage's "
        "cached_tokens on a later request sharing the prefix; 0: no cache (default "
        "%(default)s)",
        type=_non_negative_int,
        default=65536,
    )
    parser.add_argument("--version", action="version", version=f"llmgw-sim {SIM_VERSION}")
    return parser


def parse_config(argv: Sequence[str] | None = None) -> Config:
    """Return the configuration a command line (and LLMGW_SIM_* variables) asks for."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # Defaults taken from the environment skip argparse's choices check: check here.
    if args.logprob_style not in LOGPROB_STYLES:
        parser.error(f"--logprob-style must be one of {', '.join(LOGPROB_STYLES)}")
    guard_format = args.guard_format or None
    if guard_format is not None and guard_format not in GUARD_FORMATS:
        parser.error(f"--guard-format must be one of {', '.join(GUARD_FORMATS)}")
    if not args.unsafe_marker:
        parser.error("--unsafe-marker must not be empty")
    categories = tuple(c.strip() for c in args.guard_categories.split(",") if c.strip())
    weights = None
    if args.weights:
        try:
            weights = simweights.load(args.weights)
        except (OSError, simweights.WeightsFileError) as exc:
            parser.error(f"--weights: {exc}")
    return Config(
        model=args.model,
        host=args.host,
        port=args.port,
        ttft=args.ttft,
        tps=args.tps,
        load_time=args.load_time,
        context_length=args.context_length,
        parallel=args.parallel,
        slowdown=args.slowdown,
        logprob_style=args.logprob_style,
        guard_format=guard_format,
        guard_categories=categories,
        unsafe_marker=args.unsafe_marker,
        controversial_marker=args.controversial_marker,
        fail_every=args.fail_every,
        api_key=args.api_key or "",
        weights=weights,
        prefix_cache_tokens=args.prefix_cache_tokens,
    )
