"""What a replica needs on disk before its engine starts: its weights and adapters.

``prepare`` may download (the supervisor runs it in a thread of the replica's own, and
cancels it through ``cancel``); it raises ``agent.weights.WeightsError``.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agent import weights

Prepared = tuple[str, dict[str, str], str]


def prepare(
    spec: Mapping[str, Any],
    weights_dir: Path,
    folders: Sequence[Path],
    hosts: Sequence[str] | None,
    adapters_dir: Path,
    cancel: threading.Event,
    progress: Callable[[int, int | None], None],
    mirror: Any = None,
) -> Prepared:
    """Return a replica's weights path, its adapters' paths by name, and the folder that
    holds the adapters by name for vLLM ("" when it loads none by name)."""
    engine = str(spec.get("engine", ""))
    path = weights.resolve(
        str(spec.get("source") or ""),
        engine,
        weights_dir,
        sha256=spec.get("sha256") or None,
        progress=progress,
        cancel=cancel,
        folders=folders,
        hosts=hosts,
        mirror=mirror,
        model=str(spec.get("model") or ""),
    )
    adapters = {
        str(a["name"]): weights.resolve(
            str(a["source"]),
            engine,
            weights_dir,
            cancel=cancel,
            folders=folders,
            hosts=hosts,
        )
        for a in spec.get("adapters") or []
    }
    adapter_dir = ""
    if engine == "vllm" and int(spec.get("max_loaded_adapters") or 0) > 0:
        adapter_dir = str(_link_adapters(adapters_dir, adapters))
    return path, adapters, adapter_dir


def _link_adapters(folder: Path, adapters: Mapping[str, str]) -> Path:
    """Return a folder holding each adapter under its name, for vLLM to find by name."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, path in adapters.items():
        link = folder / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.abspath(path))
    return folder


def readable(source: str, folders: Sequence[Path], hosts: Sequence[str] | None) -> bool:
    """Return whether a local source is in a weights folder and there."""
    try:
        weights.check_source(source, folders, hosts)
    except weights.WeightsError:
        return False
    return os.path.exists(os.path.expanduser(source))
