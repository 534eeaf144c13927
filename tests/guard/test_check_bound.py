"""A guard check the gateway waits for on a thread is bounded as a whole
(``gateway.path.guarding.Guard.judge``, ``guard.checks.check_bound``): a check stuck past
its judges' timeouts (a read that hangs, the thread pool's queue) is given up on, and
the policy's ``fail`` decides as if every judge timed out (``guard.checks.unanswered``):
``fail: closed`` refuses, ``fail: open`` allows and says it failed open."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from gateway.path.guarding import Guard
from guard import checks, snapshots
from guard.policy import FAIL_CLOSED, FAIL_OPEN, Policy


def _snapshot(fail: str, timeout: float = 1.0) -> snapshots.Snapshot:
    judge = snapshots.Judge(name="judge", format="qwen3guard", categories=(), variant=None,
                           context_length=4096, endpoint="http://127.0.0.1:9", timeout=timeout)  # fmt: skip
    return snapshots.Snapshot(policy=Policy(("judge",), fail=fail), stored=True, judges=(judge,))


def test_the_bound_follows_the_judges_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(snapshots.kept(), "peek", lambda: _snapshot(FAIL_OPEN, timeout=3))
    assert checks.check_bound() == 2 * 3 + checks.CHECK_MARGIN


@pytest.mark.parametrize(("fail", "decision"), [(FAIL_CLOSED, "refuse"), (FAIL_OPEN, "allow"),
                                                (None, "refuse")])  # fmt: skip
def test_a_check_stuck_on_its_thread_is_given_up_on_and_fail_decides(
    monkeypatch: pytest.MonkeyPatch, fail: str | None, decision: str
) -> None:
    release = threading.Event()

    async def nothing_on_the_loop(*args: Any, **kw: Any) -> None:
        return None

    def stuck(*args: Any, **kw: Any) -> dict[str, Any]:
        release.wait(60)
        return {"decision": "allow"}

    snap = _snapshot(fail) if fail else None
    monkeypatch.setattr(checks, "check_on_loop", nothing_on_the_loop)
    monkeypatch.setattr(checks, "check", stuck)
    monkeypatch.setattr(checks, "check_bound", lambda: 0.3, raising=False)
    monkeypatch.setattr(snapshots.kept(), "peek", lambda: snap)
    try:
        started = time.monotonic()
        result = asyncio.run(asyncio.wait_for(Guard().judge("hello"), 30))
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 10, took  # the bound (0.3 s), not the stuck check's minute
    assert result["decision"] == decision
    assert result["verdict"] is None and result["judge"] is None
    assert [f["kind"] for f in result["failures"]] == ["timeout"]
    assert "no answer within 0.3 s" in result["failures"][0]["message"]
    assert result["failed_open"] is (fail == FAIL_OPEN)


def test_the_check_api_bounds_a_check_stuck_on_its_thread_the_same_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``POST /api/v1/guard/check`` on the event loop (``guard.api.lean``): the same bound,
    the same outcome."""
    from guard.api import lean

    release = threading.Event()

    async def nothing_on_the_loop(*args: Any, **kw: Any) -> None:
        return None

    def stuck(*args: Any, **kw: Any) -> dict[str, Any]:
        release.wait(60)
        return {"decision": "allow"}

    monkeypatch.setattr(lean, "token_user_in_memory", lambda secret: ("user", None))
    monkeypatch.setattr(lean, "token_user", lambda secret: ("user", None))
    monkeypatch.setattr(lean, "has_role", lambda user, role: True)
    monkeypatch.setattr(checks, "check_on_loop", nothing_on_the_loop)
    monkeypatch.setattr(checks, "check", stuck)
    monkeypatch.setattr(checks, "check_bound", lambda: 0.3, raising=False)
    monkeypatch.setattr(snapshots.kept(), "peek", lambda: _snapshot(FAIL_CLOSED))
    try:
        result = asyncio.run(asyncio.wait_for(lean._answer("llmgw_x", b'{"request": "hi"}'), 30))
    finally:
        release.set()
    assert result is not None and result["decision"] == "refuse"
    assert [f["kind"] for f in result["failures"]] == ["timeout"]
