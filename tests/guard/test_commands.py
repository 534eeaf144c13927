"""The guard command: judge list, enable (idempotent), use, check, prompt."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from catalog.models import ChangeRecord, ServedModel
from guard import formats, services
from tests.cluster.helpers import join_node

pytestmark = pytest.mark.django_db


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("guard", *args, stdout=out)
    return out.getvalue()


def test_list_names_every_known_judge() -> None:
    out = run("judge", "list")
    for name in (
        "qwen3guard-0.6b",
        "qwen3guard-4b",
        "qwen3guard-8b",
        "llamaguard3-1b",
        "llamaguard3-8b",
    ):
        assert name in out
    assert "policy #1" in out.splitlines()[0]


def test_enable_is_idempotent_and_sim_runs_on_simulated_cards() -> None:
    join_node("sim-1", ["nvidia-h100-80gb"] * 2, simulated=True)
    assert "enabled" in run("judge", "enable", "qwen3guard-0.6b", "--sim")
    m = ServedModel.objects.get(name="qwen3guard-0.6b").to_spec()
    assert m.role == "guard" and m.profiles[0].engine == "sim"
    assert "already enabled" in run("judge", "enable", "qwen3guard-0.6b", "--sim")
    assert ChangeRecord.objects.filter(model_name="qwen3guard-0.6b").count() == 1


def test_enable_on_cpu_reserves_cores_and_gpu_needs_a_class() -> None:
    join_node("cpu-1", [], cpu_cores=16)
    run("judge", "enable", "qwen3guard-0.6b")
    p = ServedModel.objects.get(name="qwen3guard-0.6b").to_spec().profiles[0]
    assert (p.engine, p.cpu_cores) == ("llamacpp", 8)
    with pytest.raises(CommandError, match="GPU class"):
        run("judge", "enable", "llamaguard3-1b", "--gpu")


def test_use_sets_the_order_and_says_what_it_replaced() -> None:
    out = run("judge", "use", "llamaguard3-1b", "qwen3guard-0.6b")
    assert "judges: llamaguard3-1b, qwen3guard-0.6b" in out
    assert services.current_policy().judge_models == ("llamaguard3-1b", "qwen3guard-0.6b")
    out = run("judge", "use", "llamaguard3-8b")
    assert "replaced by" in out or "removed" in out
    with pytest.raises(CommandError):
        run("judge", "use", "nonesuch")


def test_prompt_prints_exactly_what_the_judge_receives(tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "r.txt").write_text("how do I kill all child processes in bash")
    call_command(
        "guard", "prompt", "--judge", "qwen3guard-0.6b", "--request-file", str(tmp_path / "r.txt")
    )
    printed = capsys.readouterr().out
    assert printed == formats.render(
        "qwen3guard", "how do I kill all child processes in bash", for_raw_completion=True
    )


def test_check_prints_the_json_the_api_answers() -> None:
    out = run("check", "--request", "hello")
    body = json.loads(out)
    # The baseline judge is not in the catalog here: recorded, and fail (open) decides.
    assert body["decision"] == "allow" and body["failed_open"]
    assert body["failures"][0]["kind"] == "no_replica"


def test_init_installs_the_baseline_once(capsys: Any) -> None:
    from guard.models import GuardPolicy, PolicyChange

    call_command("init")
    call_command("init")
    assert GuardPolicy.objects.count() == 1 and PolicyChange.objects.count() == 1
    m = ServedModel.objects.get(name="qwen3guard-0.6b").to_spec()
    assert m.role == "guard" and m.guard.format == "qwen3guard"
    assert ChangeRecord.objects.filter(model_name="qwen3guard-0.6b").count() == 1
    assert services.current_policy().judge_models == ("qwen3guard-0.6b",)
