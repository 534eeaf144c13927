"""What the agent finds on its node: cards, cores, memory, disk, engines. No Django here.

A GPU class names a kind of card as the agent reports it: lowercase vendor, model and
memory, like ``nvidia-h100-80gb``. A MIG instance is its card's class, ``-mig-`` and the
MIG profile: ``nvidia-a100-80gb-mig-1g.10gb``.

Cards come from ``nvidia-smi --query-gpu=... --format=csv,noheader,nounits`` and MIG
instances from ``nvidia-smi -L``; what each card uses now (memory used, utilisation) from
``USE_QUERY`` with every heartbeat. The parsers take the text, so they are tested against
recorded outputs of real cards without one.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent.engines import LORA_SCALED_COLON, LORA_SCALED_PAIR, default_binaries

AGENT_VERSION = "0.1.0"

GPU_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,memory.total,power.limit,uuid",
    "--format=csv,noheader,nounits",
]
MIG_QUERY = ["nvidia-smi", "-L"]
# What each card is using now, read with every heartbeat (the cards themselves once),
# given USE_TIMEOUT_S seconds.
USE_TIMEOUT_S = 5
USE_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,memory.used,utilization.gpu",
    "--format=csv,noheader,nounits",
]

# The sizes cards are sold by, in GB. nvidia-smi reports what the driver can use, in
# MiB, which is a little under (an L4 sold as 24 GB reports 23034 MiB): a class is named
# by the size it is sold as, so two nodes with the same card agree on its class.
_MARKETED_GB = (8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 80, 94, 96, 141, 144, 180, 192, 288)
# Within this share of a marketed size, a card is taken to be that size.
_MARKETED_TOLERANCE = 0.12

# Words in a card's name that say nothing of which card it is: the vendor (added back in
# front), product lines, form factors and memory kinds. "H100 80GB HBM3" and
# "H100 PCIe" are both an H100 with 80 GB.
_NOISE_WORDS = frozenset(
    {
        "nvidia",
        "geforce",
        "tesla",
        "quadro",
        "sxm",
        "sxm2",
        "sxm3",
        "sxm4",
        "sxm5",
        "pcie",
        "nvl",
        "hbm2",
        "hbm2e",
        "hbm3",
        "hbm3e",
        "gddr6",
        "gddr6x",
    }
)

# Power limits of simulated cards, in watts, by the model in their class; others get
# _DEFAULT_POWER_W.
_SIM_POWER_W = {
    "b200": 1000,
    "h200": 700,
    "h100": 700,
    "gh200": 900,
    "a100": 400,
    "l40s": 350,
    "a10g": 300,
    "a10": 150,
    "rtx-4090": 450,
    "l4": 72,
    "t4": 70,
}
_DEFAULT_POWER_W = 300

Run = Callable[[Sequence[str]], str | None]


def is_mig_class(gpu_class: str) -> bool:
    """Return whether a GPU class names a MIG instance rather than a whole card."""
    return "-mig-" in gpu_class.lower()


def marketed_gb(memory_mb: int) -> int:
    """Return the size in GB a card reporting this much memory (MiB) is sold as."""
    gib = memory_mb / 1024
    nearest = min(_MARKETED_GB, key=lambda size: abs(size - gib))
    if abs(nearest - gib) <= nearest * _MARKETED_TOLERANCE:
        return nearest
    return max(1, round(gib))


def gpu_class(name: str, memory_mb: int) -> str:
    """Return the class of a card from its nvidia-smi name and memory in MiB."""
    text = re.sub(r"\(.*?\)", " ", name.lower())
    words = [w for w in re.split(r"[\s\-_/]+", text) if w]
    words = [w for w in words if w not in _NOISE_WORDS and not re.fullmatch(r"\d+gb", w)]
    return "-".join(["nvidia", *words, f"{marketed_gb(memory_mb)}gb"])


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def parse_gpu_csv(text: str) -> list[dict[str, Any]]:
    """Return the whole cards in the output of ``GPU_QUERY`` (nvidia-smi's CSV)."""
    cards = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 5 or not fields[0].isdigit():
            continue
        index, name, memory, power, uuid = fields[:5]
        memory_mb = int(_number(memory) or 0)
        watts = _number(power)
        cards.append(
            {
                "index": int(index),
                "class": gpu_class(name, memory_mb),
                "memory_mb": memory_mb,
                "power_limit_w": round(watts) if watts is not None else None,
                "uuid": uuid,
                "mig_of": None,
            }
        )
    return cards


_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*([^)]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*([^)]+)\)")


def parse_mig_list(text: str) -> list[dict[str, Any]]:
    """Return the MIG instances in ``nvidia-smi -L`` output: parent index, profile, UUID."""
    instances = []
    parent: int | None = None
    for line in text.splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            parent = int(gpu.group(1))
            continue
        mig = _MIG_LINE.match(line)
        if mig and parent is not None:
            instances.append(
                {
                    "parent": parent,
                    "profile": mig.group(1).lower(),
                    "device": int(mig.group(2)),
                    "uuid": mig.group(3).strip(),
                }
            )
    return instances


def _slices(profile: str) -> int:
    match = re.match(r"(\d+)g\.", profile)
    return int(match.group(1)) if match else 1


def _profile_mb(profile: str) -> int:
    match = re.search(r"(\d+)gb", profile)
    return int(match.group(1)) * 1024 if match else 0


def cards_from(gpu_csv: str, mig_list: str = "") -> list[dict[str, Any]]:
    """Return the cards to advertise from the two nvidia-smi outputs.

    A card split into MIG instances is advertised as its instances, not whole: a
    process given the card would share it with whatever runs on them. Instances are
    numbered after the highest card index, and share their card's power limit by their
    compute slices.
    """
    whole = parse_gpu_csv(gpu_csv)
    instances = parse_mig_list(mig_list)
    by_index = {c["index"]: c for c in whole}
    split = {i["parent"] for i in instances if i["parent"] in by_index}
    cards = [c for c in whole if c["index"] not in split]
    next_index = max(by_index, default=-1) + 1
    for parent_index in sorted(split):
        parent = by_index[parent_index]
        mine = [i for i in instances if i["parent"] == parent_index]
        total_slices = sum(_slices(i["profile"]) for i in mine) or 1
        for inst in sorted(mine, key=lambda i: i["device"]):
            power = parent["power_limit_w"]
            cards.append(
                {
                    "index": next_index,
                    "class": f"{parent['class']}-mig-{inst['profile']}",
                    "memory_mb": _profile_mb(inst["profile"]),
                    "power_limit_w": (
                        round(power * _slices(inst["profile"]) / total_slices)
                        if power is not None
                        else None
                    ),
                    "uuid": inst["uuid"],
                    "mig_of": parent_index,
                }
            )
            next_index += 1
    return cards


def _run(argv: Sequence[str], timeout: float = 20) -> str | None:
    """Return a command's standard output (and error), or None when it cannot run."""
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return done.stdout + done.stderr


def discover_cards(run: Run = _run) -> list[dict[str, Any]]:
    """Return this node's cards; none when nvidia-smi is missing or fails."""
    gpus = run(GPU_QUERY)
    if not gpus:
        return []
    return cards_from(gpus, run(MIG_QUERY) or "")


def parse_use_csv(text: str, cards: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Return each advertised whole card's memory used (MiB) and utilisation (percent) from
    the output of ``USE_QUERY``.

    A figure nvidia-smi cannot give ("[N/A]", "[Not Supported]") is null. A card split into
    MIG instances is not advertised whole, and nvidia-smi gives no utilisation per
    instance: its instances have no figures.
    """
    whole = {int(c["index"]) for c in cards if c.get("mig_of") is None}
    use = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 3 or not fields[0].isdigit() or int(fields[0]) not in whole:
            continue
        memory, busy = _number(fields[1]), _number(fields[2])
        use.append(
            {
                "index": int(fields[0]),
                "memory_used_mb": None if memory is None else max(0, round(memory)),
                "utilization": None if busy is None else min(100, max(0, round(busy))),
            }
        )
    return use


def _run_quick(argv: Sequence[str]) -> str | None:
    """Run a query asked with every heartbeat: a hung nvidia-smi costs one heartbeat at
    most a few seconds, never the node's (it would be lost after 30 s without one)."""
    return _run(argv, timeout=USE_TIMEOUT_S)


def discover_use(cards: Sequence[Mapping[str, Any]], run: Run = _run_quick) -> list[dict[str, Any]]:
    """Return what this node's cards use now; none when nvidia-smi is missing or fails."""
    if not cards:
        return []
    text = run(USE_QUERY)
    return parse_use_csv(text, cards) if text else []


def device_names(cards: Sequence[Mapping[str, Any]]) -> dict[int, str]:
    """Return what CUDA_VISIBLE_DEVICES calls each MIG instance: its UUID.

    A whole card is called by its index, which the engines' command lines fall back to.
    """
    return {int(c["index"]): str(c["uuid"]) for c in cards if c.get("mig_of") is not None}


def parse_simulate(spec: str) -> list[dict[str, Any]]:
    """Return the simulated cards a ``--simulate`` spec names ("2x nvidia-h100-80gb").

    Raises:
        ValueError: the spec is not a comma-separated list of ``[N x] class``.
    """
    cards: list[dict[str, Any]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        match = re.fullmatch(r"(?:(\d+)\s*x\s*)?([a-z0-9][a-z0-9.\-+]*)", part.lower())
        if not match:
            raise ValueError(
                f'--simulate: "{part}" is not "N x class", as in "2x nvidia-h100-80gb"'
            )
        count = int(match.group(1) or 1)
        cls = match.group(2)
        if count < 1:
            raise ValueError(f'--simulate: "{part}" asks for no cards')
        card_part, _, mig = cls.partition("-mig-")
        size = re.search(r"-(\d+)gb$", card_part)
        if not cls.startswith("nvidia-") or not size:
            raise ValueError(
                f'--simulate: "{cls}" is not a GPU class: write vendor, model and memory, '
                'as in "nvidia-h100-80gb"'
            )
        model = card_part[len("nvidia-") : size.start()]
        power = _SIM_POWER_W.get(model, _DEFAULT_POWER_W)
        memory = _profile_mb(mig) if mig else int(size.group(1)) * 1024
        for _ in range(count):
            index = len(cards)
            cards.append(
                {
                    "index": index,
                    "class": cls,
                    "memory_mb": memory,
                    "power_limit_w": power,
                    "uuid": f"SIM-{cls}-{index}",
                    "mig_of": None,
                }
            )
    if not cards:
        raise ValueError("--simulate names no cards")
    return cards


def cpu_cores() -> int:
    """Return the cores this agent may use (its affinity, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def memory_mb(meminfo: str | None = None) -> int:
    """Return the node's memory in MiB, from /proc/meminfo's MemTotal."""
    if meminfo is None:
        try:
            meminfo = Path("/proc/meminfo").read_text()
        except OSError:
            return 0
    match = re.search(r"^MemTotal:\s+(\d+)\s*kB", meminfo, re.MULTILINE)
    return int(match.group(1)) // 1024 if match else 0


def disk_free_mb(path: str | os.PathLike[str]) -> int:
    """Return the free space, in MiB, of the file system a folder is (or would be) on."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free // (1024 * 1024)
    except OSError:
        return 0


def find_llama_server(configured: str | None = None) -> str | None:
    """Return the llama-server to run: the configured one, on PATH, or the build cache.

    The build cache is where scripts/build-llama-server.sh puts the binary it builds.
    """
    candidates = [configured] if configured else []
    on_path = shutil.which("llama-server")
    if on_path:
        candidates.append(on_path)
    cache = Path(os.environ.get("LLMGW_CACHE") or Path.home() / ".cache" / "llmgw")
    candidates.append(str(cache / "llama-server"))
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def parse_llama_version(text: str) -> str:
    """Return llama-server's version from its ``--version`` output.

    A build from a llama.cpp checkout prints its build number ("version: 4567 (…)"),
    reported as llama.cpp's releases are named, "b4567"; one from a source archive
    without git history prints whatever version it was given ("version: 0.5.0-dev
    (build 1, …)"), reported as it is.
    """
    match = re.search(r"version:\s*(\S+)", text)
    if not match:
        return "unknown"
    version = match.group(1)
    return f"b{version}" if version.isdigit() else version


def lora_scaled_form(help_text: str) -> str:
    """Return how this llama-server takes --lora-scaled, from its ``--help`` output.

    Builds from late 2025 on take ``FNAME:SCALE[,...]`` as one argument; older ones take
    ``FNAME SCALE`` as two, and neither accepts the other's form.
    """
    return LORA_SCALED_COLON if "FNAME:SCALE" in help_text else LORA_SCALED_PAIR


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _script(name: str) -> str:
    """Return a console script installed beside the agent's interpreter, or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    return shutil.which(name) or name


def discover_engines(
    llama_server: str | None = None, run: Run = _run
) -> tuple[dict[str, str], dict[str, str]]:
    """Return the engines installed here (name → version) and the programs that run them.

    The simulator is always there: it is part of the agent.
    """
    engines = {"sim": "1"}
    binaries = default_binaries()
    path = find_llama_server(llama_server)
    if path:
        engines["llamacpp"] = parse_llama_version(run([path, "--version"]) or "")
        binaries["llama-server"] = path
        binaries["llama-server-lora-scaled"] = lora_scaled_form(run([path, "--help"]) or "")
    for engine, package, script in (
        ("vllm", "vllm", "vllm"),
        ("sglang", "sglang", None),
        ("trtllm", "tensorrt_llm", "trtllm-serve"),
    ):
        version = _package_version(package)
        if version:
            engines[engine] = version
            if script:
                binaries[script] = _script(script)
    return engines, binaries


def hostname() -> str:
    """Return this node's host name."""
    return socket.gethostname()


def inventory(
    *,
    cards: Sequence[Mapping[str, Any]],
    engines: Mapping[str, str],
    labels: Mapping[str, str],
    weights_dir: str | os.PathLike[str],
    weights: Sequence[str] = (),
    simulated: bool = False,
    host: str | None = None,
    cards_use: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Return the inventory the agent sends on join and every heartbeat; ``cards_use``,
    what each card uses now (``discover_use``, or the sim's figures), when known."""
    inv: dict[str, Any] = {
        "hostname": host or hostname(),
        "agent_version": AGENT_VERSION,
        "cpu_cores": cpu_cores(),
        "memory_mb": memory_mb(),
        "disk_free_mb": disk_free_mb(weights_dir),
        "labels": dict(labels),
        "engines": dict(engines),
        "cards": [dict(c) for c in cards],
        "weights": sorted(set(weights)),
        "simulated": simulated,
    }
    if cards_use is not None:
        inv["cards_use"] = [dict(u) for u in cards_use]
    return inv
