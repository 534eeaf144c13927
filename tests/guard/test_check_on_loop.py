"""A check answered on the web process's event loop (``guard.checks.check_on_loop``),
and how it hands over to a thread: the answer is the thread's, every judge is asked
once, and what it did is counted. Real judges: the sim engine, and small servers
(tests.guard.test_pool) for a judge that errs or never answers.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from guard import checks, records, services, snapshots
from guard.models import JudgeDecision, JudgeHealth
from llmgw_core.models import ApiToken
from tests.guard.helpers import guard_model
from tests.guard.test_lean import answered_by_django, fresh_memory, judge_url, send
from tests.guard.test_pool import Server, answering, servers

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["fresh_memory", "judge_url", "servers"]  # fixtures from other modules

HARMFUL = "help me UNSAFE-MARKER now"


@pytest.fixture
def recorder() -> Iterator[records.Recorder]:
    """The recorder running, as in the web process; stopped (and flushed) after."""
    records.RECORDER.start()
    yield records.RECORDER
    records.RECORDER.stop()


def policy(*names: str) -> None:
    services.set_policy({"judge": {"models": list(names)}}, surface="cli", name="t")


def erring(servers: list[Server]) -> tuple[Server, list[bytes]]:
    """A judge that answers every ask with HTTP 500; the requests it was sent."""
    seen: list[bytes] = []
    server = answering(b"500 Internal Server Error", b'{"error": "out of memory"}', seen)
    servers.append(server)
    return server, seen


def test_a_check_with_everything_in_memory_is_answered_on_the_loop(
    judge_url: str, recorder: records.Recorder
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=judge_url)
    policy("qwen3guard-0.6b")
    assert asyncio.run(checks.check_on_loop(HARMFUL)) is None  # nothing in memory yet
    threaded = checks.check(HARMFUL)  # loads the policy and its judges
    # On the loop a query would raise (Django refuses them there): none is made.
    on_loop = asyncio.run(checks.check_on_loop(HARMFUL))
    assert isinstance(on_loop, dict)
    for answer in (threaded, on_loop):
        answer.pop("latency_ms")
    assert on_loop == threaded
    assert on_loop["decision"] == "refuse" and on_loop["categories"] == ["Violent"]
    recorder.flush()
    assert JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers == 2
    assert JudgeDecision.objects.get(judge="qwen3guard-0.6b", verdict="unsafe").count == 2


def test_without_the_recorder_nothing_is_asked_on_the_loop(judge_url: str) -> None:
    guard_model("qwen3guard-0.6b", endpoint=judge_url)
    policy("qwen3guard-0.6b")
    checks.check("x")
    # Each result would be written at once, with a query: the thread does it all.
    assert asyncio.run(checks.check_on_loop("x")) is None


def test_a_first_judge_that_fails_is_asked_once_and_the_next_decides(
    judge_url: str, recorder: records.Recorder, servers: list[Server], make_user: Any
) -> None:
    bad, seen = erring(servers)
    guard_model("broken-judge", endpoint=bad.url)
    guard_model("qwen3guard-0.6b", endpoint=judge_url)
    policy("broken-judge", "qwen3guard-0.6b")
    token = ApiToken.issue(make_user("gw", "viewer"), "gateway")[1]
    # The policy, its judges and the token in memory.
    assert send("POST", token=token, body={"request": "warm up"}).status_code == 200
    recorder.flush()
    failures = JudgeHealth.objects.get(judge="broken-judge").failures
    asked = len(seen)

    r = send("POST", token=token, body={"request": HARMFUL})
    assert r.status_code == 200 and not answered_by_django(r)
    got = r.json()
    assert (got["judge"], got["verdict"], got["decision"]) == (
        "qwen3guard-0.6b",
        "unsafe",
        "refuse",
    )
    assert [(f["judge"], f["kind"]) for f in got["failures"]] == [("broken-judge", "http_error")]
    assert "HTTP 500" in got["failures"][0]["message"]
    assert len(seen) == asked + 1  # asked once: the thread went on from the next judge
    recorder.flush()
    assert JudgeHealth.objects.get(judge="broken-judge").failures == failures + 1


def test_a_first_judge_that_times_out_is_not_waited_for_twice(
    judge_url: str, recorder: records.Recorder, servers: list[Server]
) -> None:
    quiet = threading.Event()
    silent = Server(lambda conn: quiet.wait(10))
    servers.append(silent)
    guard_model("silent-judge", endpoint=silent.url)
    guard_model("qwen3guard-0.6b", endpoint=judge_url)
    policy("silent-judge", "qwen3guard-0.6b")
    snapshots.snapshot()

    asked = asyncio.run(checks.check_on_loop("how do I list files?", timeout=0.5))
    assert isinstance(asked, checks.Asked) and asked.judge == "silent-judge"
    assert silent.accepted == 1
    # The loop's timeout has passed; the next judge is given all the time it needs.
    result = checks.check("how do I list files?", timeout=30, asked=asked)
    quiet.set()
    assert silent.accepted == 1  # the thread took the loop's answer, and did not ask again
    assert result["judge"] == "qwen3guard-0.6b" and result["decision"] == "allow"
    assert [(f["judge"], f["kind"]) for f in result["failures"]] == [("silent-judge", "timeout")]


def test_a_text_longer_than_the_estimate_allows_is_judged_on_a_thread(
    judge_url: str, recorder: records.Recorder, make_user: Any
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=judge_url, context_length=1024)
    policy("qwen3guard-0.6b")
    checks.check("warm up")
    long_text = "please list the files in this folder " * 400 + HARMFUL
    assert asyncio.run(checks.check_on_loop(long_text)) is None  # nothing asked on the loop
    token = ApiToken.issue(make_user("gw", "viewer"), "gateway")[1]
    r = send("POST", token=token, body={"request": long_text})
    assert r.status_code == 200 and not answered_by_django(r)
    # The end is kept when a long text is cut: the marker near it still decides.
    assert r.json()["verdict"] == "unsafe" and r.json()["failures"] == []


def test_a_judge_ready_only_second_in_line_answers_on_the_loop_once_the_snapshot_was_reread(
    judge_url: str, recorder: records.Recorder
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=judge_url)
    policy("qwen3guard-4b", "qwen3guard-0.6b")  # the first is not in the catalog
    snapshots.snapshot()
    # Its "no replica" failure may mean the snapshot is stale: a thread reads it again
    # (and does not ask the judge the loop asked).
    asked = asyncio.run(checks.check_on_loop("x"))
    assert isinstance(asked, checks.Asked) and asked.judge == "qwen3guard-0.6b"
    result = checks.check("x", asked=asked)
    assert result["judge"] == "qwen3guard-0.6b"
    assert [f["judge"] for f in result["failures"]] == ["qwen3guard-4b"]
    # Read again and still so: the checks after it are answered on the loop.
    done = asyncio.run(checks.check_on_loop("x"))
    assert isinstance(done, dict) and done["judge"] == "qwen3guard-0.6b"
    assert [(f["judge"], f["kind"]) for f in done["failures"]] == [("qwen3guard-4b", "no_replica")]
