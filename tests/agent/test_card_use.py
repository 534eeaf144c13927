"""What each card uses, as the agent reports it with every heartbeat: read from
nvidia-smi's recorded output on a real node, and, on a simulated one, derived from its
replicas' state and the load a real sim engine says on its /health."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import httpx

from agent.discovery import USE_QUERY, cards_from, discover_use, inventory, parse_use_csv
from agent.simcards import HELD_SHARE, card_figures, engine_load
from tests.agent.test_sim import launch

# nvidia-smi --query-gpu=index,memory.used,utilization.gpu --format=csv,noheader,nounits on
# two H100s, the second idle; then one whose figures the driver cannot give.
H100_USE = "0, 71234, 87\n1, 4, 0\n"
NA_USE = "0, [N/A], [Not Supported]\n"
H100_X2 = "0, NVIDIA H100 80GB HBM3, 81559, 700.00, GPU-a\n1, NVIDIA H100 80GB HBM3, 81559, 700.00, GPU-b\n"


def test_each_cards_memory_used_and_utilisation_read_from_nvidia_smi() -> None:
    cards = cards_from(H100_X2)
    assert parse_use_csv(H100_USE, cards) == [
        {"index": 0, "memory_used_mb": 71234, "utilization": 87},
        {"index": 1, "memory_used_mb": 4, "utilization": 0},
    ]
    assert parse_use_csv(NA_USE, cards) == [
        {"index": 0, "memory_used_mb": None, "utilization": None}
    ]
    # A line for a card that is not advertised (split into MIG instances) says nothing.
    assert parse_use_csv("7, 10, 10\nNo devices were found\n", cards) == []


def test_the_use_query_is_asked_with_every_inventory_and_missing_nvidia_smi_says_none() -> None:
    asked: list[Sequence[str]] = []

    def run(argv: Sequence[str]) -> str | None:
        asked.append(argv)
        return H100_USE

    cards = cards_from(H100_X2)
    use = discover_use(cards, run)
    assert asked == [USE_QUERY] and "memory.used,utilization.gpu" in USE_QUERY[1]
    inv = inventory(cards=cards, engines={}, labels={}, weights_dir="/tmp", cards_use=use)
    assert inv["cards_use"][0] == {"index": 0, "memory_used_mb": 71234, "utilization": 87}
    assert discover_use(cards, lambda argv: None) == []
    assert "cards_use" not in inventory(cards=cards, engines={}, labels={}, weights_dir="/tmp")


def test_simulated_figures_follow_each_replicas_state_and_load() -> None:
    cards = [{"index": i, "memory_mb": 10_000} for i in range(4)]
    replicas = [
        {"cards": [0, 1], "state": "ready", "progress": None, "load": 0.5},
        {"cards": [2], "state": "loading", "progress": 0.5, "load": None},
    ]
    assert card_figures(cards, replicas) == [
        {"index": 0, "memory_used_mb": round(10_000 * HELD_SHARE), "utilization": 50},
        {"index": 1, "memory_used_mb": round(10_000 * HELD_SHARE), "utilization": 50},
        {"index": 2, "memory_used_mb": round(10_000 * HELD_SHARE * 0.5), "utilization": 30},
        {"index": 3, "memory_used_mb": 0, "utilization": 0},
    ]


def test_a_sim_engines_health_says_its_busy_slots_and_the_agent_reads_them() -> None:
    sim = launch("--model", "m", "--parallel", "2", "--ttft", "5", "--tps", "1000")
    try:
        port = int(sim.url.rsplit(":", 1)[1])
        assert engine_load(port) == 0.0
        # One request held in its slot (a 5 s first token): half the slots are busy.
        held = threading.Thread(
            target=lambda: httpx.post(
                sim.url + "/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
                timeout=30,
            )
        )
        held.start()
        seen: list[Any] = []
        while held.is_alive() and 0.5 not in seen:
            seen.append(engine_load(port))
        assert 0.5 in seen, seen
        held.join()
        assert engine_load(port) == 0.0
    finally:
        sim.stop()
    assert engine_load(port) is None  # gone: nothing to say
