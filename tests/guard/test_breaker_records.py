"""Each judge's timeout from its slo, and its breaker as the console sees it: written per
process off the path (guard.records), read into the judges' health (guard.live)."""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import sys
from typing import Any

import pytest
from django.template.loader import render_to_string

from guard import breaker as b
from guard import checks as guard_checks
from guard import client, live, records
from guard import snapshots as guard_snapshots
from guard.chain import Stats
from guard.models import JudgeBreaker
from tests.guard.helpers import guard_model

T = 1_790_000_000.0


def at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, tz=dt.UTC)


@pytest.mark.parametrize(
    ("fmt", "ttft_ms", "tpot_ms", "expected"),
    [
        ("qwen3guard", 0, 0, 5.0),  # no slo: the setting
        ("qwen3guard", 0, 10, 5.0),  # no ttft: the setting
        ("qwen3guard", 200, 10, 3 * (0.2 + 64 * 0.01)),
        ("llamaguard3", 200, 0, 1.0),  # 3 x 0.2 s, no tpot: the floor
        ("llamaguard3", 500, 0, 1.5),
        ("shieldgemma", 100, 5, 1.0),  # 3 x 0.12 s: the floor
        ("json", 500, 20, 3 * (0.5 + 128 * 0.02)),
    ],
)
def test_a_judges_timeout_comes_from_its_slo(
    fmt: str, ttft_ms: int, tpot_ms: int, expected: float
) -> None:
    got = client.judge_timeout(fmt, ttft_ms * 1_000_000, tpot_ms * 1_000_000, 5.0)
    assert got == pytest.approx(expected)


def test_the_check_gives_each_judge_its_own_timeout(db: Any, settings: Any) -> None:
    settings.LLMGW_GUARD_JUDGE_TIMEOUT = 7
    guard_model("plain", endpoint="http://127.0.0.1:9")
    guard_model("fast", slo={"ttft_p99": "300ms", "tpot_p99": "20ms"})
    found = {j.name: j.timeout for j in guard_snapshots.judges(["plain", "fast"])}
    assert found == {"plain": 7.0, "fast": pytest.approx(3 * (0.3 + 64 * 0.02))}


def test_a_breakers_change_is_written_per_process_and_shown_on_the_judges_card(db: Any) -> None:
    guard_model("judge")
    opened = b.State(b.OPEN, 5, T, T, 5.0, T + 5, None, "timeout")
    records.write(Stats(breakers={"judge": opened}))
    row = JudgeBreaker.objects.get(judge="judge")
    assert (row.process, row.state, row.since, row.next_probe, row.failures, row.last_kind) == (
        records.process_name(), "open", at(T), at(T + 5), 5, "timeout")  # fmt: skip
    # Another process's breaker of the same judge is its own row.
    JudgeBreaker.objects.create(judge="judge", process="elsewhere:1", state="closed",
                                updated=at(T))  # fmt: skip
    health = live.judge_health_row("judge")
    assert health is not None and health.breaker == b.OPEN and len(health.tripped) == 1
    html = render_to_string("guard/partials/judge_health.html", {"row": health})
    assert 'data-role="judge-breaker" data-state="open"' in html
    assert "after 5 failures in a row (timeout)" in html and "next probe" in html
    assert records.process_name() in html

    # Half-open, then closed: the card follows.
    records.write(Stats(breakers={"judge": b.admit(opened, T + 5, 2.0)[1]}))
    assert live.judge_health_row("judge").breaker == b.HALF_OPEN  # type: ignore[union-attr]
    records.write(Stats(breakers={"judge": b.succeeded(opened, T + 6)}))
    health = live.judge_health_row("judge")
    assert health is not None and health.breaker == b.CLOSED and health.tripped == []
    html = render_to_string("guard/partials/judge_health.html", {"row": health})
    assert 'data-state="closed"' in html and "next probe" not in html


def test_without_a_recorder_a_change_is_written_at_once(db: Any) -> None:
    assert not records.RECORDER.running
    guard_checks.BREAKERS.clear()
    guard_model("judge")
    for _ in range(5):
        guard_checks.BREAKERS.failed("judge", "refused")
    row = JudgeBreaker.objects.get(judge="judge")
    assert (row.state, row.failures, row.last_kind) == ("open", 5, "refused")


def test_a_starting_process_deletes_the_rows_of_its_hosts_stopped_processes(db: Any) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    dead = f"{socket.gethostname()}:{done.stdout.strip()}"
    for process in (dead, records.process_name(), "another-host:1"):
        JudgeBreaker.objects.create(judge="judge", process=process, state="open", updated=at(T))
    assert records.forget_dead_processes() == 1
    assert set(JudgeBreaker.objects.values_list("process", flat=True)) == {
        records.process_name(), "another-host:1"}  # fmt: skip
