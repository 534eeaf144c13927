"""Discovery: cards from recorded nvidia-smi output, simulated cards, the node's resources."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent import discovery
from agent.discovery import (
    cards_from,
    device_names,
    discover_cards,
    gpu_class,
    is_mig_class,
    lora_scaled_form,
    marketed_gb,
    parse_gpu_csv,
    parse_llama_version,
    parse_mig_list,
    parse_simulate,
)
from agent.engines import LORA_SCALED_COLON, LORA_SCALED_PAIR

# Recorded `nvidia-smi --query-gpu=index,name,memory.total,power.limit,uuid
# --format=csv,noheader,nounits` output of real cards.
H100_X2 = """\
0, NVIDIA H100 80GB HBM3, 81559, 700.00, GPU-1b6f2e1c-7c0e-8a3d-2f4e-3a4b5c6d7e8f
1, NVIDIA H100 80GB HBM3, 81559, 700.00, GPU-2c7a3f2d-8d1f-9b4e-3a5f-4b5c6d7e8f90
"""
A100 = "0, NVIDIA A100-SXM4-80GB, 81920, 400.00, GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a5c\n"
L4 = "0, NVIDIA L4, 23034, 72.00, GPU-a3b4c5d6-e7f8-9012-3456-789abcdef012\n"
RTX_4090 = "0, NVIDIA GeForce RTX 4090, 24564, 450.00, GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n"
A10G = "0, NVIDIA A10G, 23028, 300.00, GPU-9a8b7c6d-5e4f-3a2b-1c0d-e9f8a7b6c5d4\n"

# `nvidia-smi -L` on an A100 split into MIG instances, beside a whole one.
A100_MIG_CSV = """\
0, NVIDIA A100-SXM4-80GB, 81920, 400.00, GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a5c
1, NVIDIA A100-SXM4-80GB, 81920, 400.00, GPU-6e6cb1e7-e44e-3c3d-635e-af4e9e3c9b6d
"""
A100_MIG_L = """\
GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a5c)
  MIG 3g.40gb     Device  0: (UUID: MIG-0e8d0f5b-6b0b-5f3e-9c9a-1a3b4c5d6e7f)
  MIG 2g.20gb     Device  1: (UUID: MIG-1f9e1a6c-7c1c-6a4f-0dab-2b4c5d6e7f80)
  MIG 1g.10gb     Device  2: (UUID: MIG-2a0f2b7d-8d2d-7b5a-1ebc-3c5d6e7f8091)
GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-6e6cb1e7-e44e-3c3d-635e-af4e9e3c9b6d)
"""


@pytest.mark.parametrize(
    ("csv", "cls", "memory", "watts"),
    [
        (A100, "nvidia-a100-80gb", 81920, 400),
        (L4, "nvidia-l4-24gb", 23034, 72),
        (RTX_4090, "nvidia-rtx-4090-24gb", 24564, 450),
        (A10G, "nvidia-a10g-24gb", 23028, 300),
    ],
)
def test_recorded_cards_are_named_as_catalog_md_says(
    csv: str, cls: str, memory: int, watts: int
) -> None:
    [card] = parse_gpu_csv(csv)
    assert card == {
        "index": 0,
        "class": cls,
        "memory_mb": memory,
        "power_limit_w": watts,
        "uuid": csv.split(", ")[-1].strip(),
        "mig_of": None,
    }


def test_h100_cards_keep_their_indexes() -> None:
    cards = parse_gpu_csv(H100_X2)
    assert [(c["index"], c["class"], c["memory_mb"]) for c in cards] == [
        (0, "nvidia-h100-80gb", 81559),
        (1, "nvidia-h100-80gb", 81559),
    ]


@pytest.mark.parametrize(
    ("name", "memory", "cls"),
    [
        ("NVIDIA H100 PCIe", 81559, "nvidia-h100-80gb"),
        ("NVIDIA H100 NVL", 95830, "nvidia-h100-94gb"),
        ("NVIDIA H200", 143771, "nvidia-h200-141gb"),
        ("NVIDIA L40S", 46068, "nvidia-l40s-48gb"),
        ("NVIDIA A100-PCIE-40GB", 40960, "nvidia-a100-40gb"),
        ("Tesla T4", 15360, "nvidia-t4-16gb"),
        ("Tesla V100-SXM2-32GB", 32768, "nvidia-v100-32gb"),
        ("NVIDIA RTX A6000", 49140, "nvidia-rtx-a6000-48gb"),
    ],
)
def test_more_cards(name: str, memory: int, cls: str) -> None:
    assert gpu_class(name, memory) == cls


def test_memory_rounds_to_the_size_sold() -> None:
    assert marketed_gb(81559) == 80
    assert marketed_gb(23034) == 24
    # Far from any size cards are sold in: the nearest whole GB.
    assert marketed_gb(60 * 1024) == 60


def test_power_limit_not_reported() -> None:
    [card] = parse_gpu_csv("0, NVIDIA A10G, 23028, [N/A], GPU-x\n")
    assert card["power_limit_w"] is None


def test_garbage_lines_ignored() -> None:
    assert parse_gpu_csv("No devices were found\n\n") == []


def test_mig_instances_parsed() -> None:
    instances = parse_mig_list(A100_MIG_L)
    assert [(i["parent"], i["profile"], i["device"]) for i in instances] == [
        (0, "3g.40gb", 0),
        (0, "2g.20gb", 1),
        (0, "1g.10gb", 2),
    ]
    assert instances[0]["uuid"] == "MIG-0e8d0f5b-6b0b-5f3e-9c9a-1a3b4c5d6e7f"


def test_a_split_card_is_advertised_as_its_mig_instances() -> None:
    cards = cards_from(A100_MIG_CSV, A100_MIG_L)
    assert [(c["index"], c["class"], c["mig_of"]) for c in cards] == [
        (1, "nvidia-a100-80gb", None),
        (2, "nvidia-a100-80gb-mig-3g.40gb", 0),
        (3, "nvidia-a100-80gb-mig-2g.20gb", 0),
        (4, "nvidia-a100-80gb-mig-1g.10gb", 0),
    ]
    assert [c["memory_mb"] for c in cards[1:]] == [40960, 20480, 10240]
    # The card's 400 W shared by compute slices: 3, 2 and 1 of 6.
    assert [c["power_limit_w"] for c in cards[1:]] == [200, 133, 67]
    assert all(is_mig_class(c["class"]) for c in cards[1:])
    assert device_names(cards) == {
        2: "MIG-0e8d0f5b-6b0b-5f3e-9c9a-1a3b4c5d6e7f",
        3: "MIG-1f9e1a6c-7c1c-6a4f-0dab-2b4c5d6e7f80",
        4: "MIG-2a0f2b7d-8d2d-7b5a-1ebc-3c5d6e7f8091",
    }


def test_h100_mig_profiles_with_media_extensions() -> None:
    text = (
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n  MIG 1g.10gb+me   Device  0: (UUID: MIG-a)\n"
    )
    [card] = cards_from("0, NVIDIA H100 80GB HBM3, 81559, 700.00, GPU-1\n", text)
    assert card["class"] == "nvidia-h100-80gb-mig-1g.10gb+me"


def test_no_nvidia_smi_no_cards() -> None:
    def missing(argv: Sequence[str]) -> str | None:
        return None

    assert discover_cards(missing) == []


def test_discover_cards_runs_both_queries() -> None:
    outputs = {"--query-gpu": A100_MIG_CSV, "-L": A100_MIG_L}

    def run(argv: Sequence[str]) -> str | None:
        key = "-L" if argv[1] == "-L" else "--query-gpu"
        return outputs[key]

    assert len(discover_cards(run)) == 4


def test_simulated_cards() -> None:
    cards = parse_simulate("2x nvidia-h100-80gb, 1x nvidia-l4-24gb")
    assert [(c["index"], c["class"], c["memory_mb"], c["power_limit_w"]) for c in cards] == [
        (0, "nvidia-h100-80gb", 81920, 700),
        (1, "nvidia-h100-80gb", 81920, 700),
        (2, "nvidia-l4-24gb", 24576, 72),
    ]
    assert len({c["uuid"] for c in cards}) == 3


def test_simulated_cards_unknown_model_and_mig() -> None:
    [other, mig] = parse_simulate("nvidia-x9-12gb,nvidia-a100-80gb-mig-1g.10gb")
    assert other["power_limit_w"] == 300
    assert mig["class"] == "nvidia-a100-80gb-mig-1g.10gb"
    assert mig["memory_mb"] == 10240


@pytest.mark.parametrize("spec", ["", "2x", "two nvidia-h100-80gb", "2x h100", "0x nvidia-l4-24gb"])
def test_bad_simulate_specs_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--simulate"):
        parse_simulate(spec)


def test_memory_from_meminfo() -> None:
    assert discovery.memory_mb("MemTotal:       24590336 kB\nMemFree: 1 kB\n") == 24014
    assert discovery.memory_mb() > 0


def test_cpu_cores_and_disk(tmp_path: Path) -> None:
    assert discovery.cpu_cores() == len(os.sched_getaffinity(0))
    # A weights folder not made yet: the free space where it will be.
    assert discovery.disk_free_mb(tmp_path / "not" / "yet") > 0


def test_llama_server_version_and_lora_form() -> None:
    assert parse_llama_version("version: 4567 (a1b2c3d)\nbuilt with cc") == "b4567"
    assert parse_llama_version("") == "unknown"
    # Built from the source vendored in llama-cpp-python (scripts/build-llama-server.sh).
    assert (
        parse_llama_version("version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0")
        == "0.5.0-dev"
    )
    assert lora_scaled_form("--lora-scaled FNAME:SCALE,...  path to LoRA") == LORA_SCALED_COLON
    assert lora_scaled_form("--lora-scaled FNAME SCALE  path to LoRA") == LORA_SCALED_PAIR


def test_engines_found(tmp_path: Path) -> None:
    fake = tmp_path / "llama-server"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--version" ]; then echo "version: 7001 (deadbee)" >&2; fi\n'
        'if [ "$1" = "--help" ]; then echo "--lora-scaled FNAME:SCALE,..."; fi\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    engines, binaries = discovery.discover_engines(str(fake))
    assert engines["sim"] == "1"
    assert engines["llamacpp"] == "b7001"
    assert binaries["llama-server"] == str(fake)
    assert binaries["llama-server-lora-scaled"] == LORA_SCALED_COLON
    # Not installed in the project's environment: not advertised.
    assert "vllm" not in engines


def test_no_llama_server_no_llamacpp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("LLMGW_CACHE", str(tmp_path))
    engines, _ = discovery.discover_engines(str(tmp_path / "absent"))
    assert "llamacpp" not in engines


def test_inventory(tmp_path: Path) -> None:
    cards = parse_simulate("1x nvidia-l4-24gb")
    inv = discovery.inventory(
        cards=cards,
        engines={"sim": "1"},
        labels={"llmgw.io/rack": "r12"},
        weights_dir=tmp_path,
        weights=["/m/b.gguf", "/m/a.gguf", "/m/a.gguf"],
        simulated=True,
        host="gpu-07",
    )
    assert inv["hostname"] == "gpu-07"
    assert inv["agent_version"] == discovery.AGENT_VERSION
    assert inv["cards"] == cards
    assert inv["weights"] == ["/m/a.gguf", "/m/b.gguf"]
    assert inv["simulated"] is True
    assert inv["labels"] == {"llmgw.io/rack": "r12"}
    assert inv["cpu_cores"] >= 1 and inv["memory_mb"] > 0 and inv["disk_free_mb"] > 0
