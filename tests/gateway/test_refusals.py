"""The guard's refusal records: written off the request path in batches, a
failed batch put back, bounded; every refusal the real Gateway makes recorded by the
request id its client got; found in the console's list, the API and the admin by role;
deleted after ``LLMGW_GATEWAY_REFUSAL_DAYS`` by the periodic job."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from django.db import DataError
from django.utils import timezone

from gateway import tasks
from gateway.models import Refusal
from gateway.records.observe import Fanout, RefusalHeard
from gateway.records.refusals import RefusalRecorder, prune, write
from tests.gateway.harness import KEY, Harness, model
from tests.waiting import wait_until

AT = 1_800_000_000.0  # 2027-01-15 08:00 UTC


def heard(request_id: str = "req_1", **kw: Any) -> RefusalHeard:
    values: dict[str, Any] = {"request_id": request_id, "key": "app", "owner": "team:t",
                              "model": "chat", "direction": "request", "judge": "judge",
                              "verdict": "unsafe", "categories": ("Violent",), "score": 0.97,
                              "judged": True}  # fmt: skip
    values.update(kw)
    return RefusalHeard(**values)


def stored() -> list[tuple[str, str]]:
    return list(Refusal.objects.order_by("at", "request_id").values_list("request_id", "direction"))


# The recorder.


def test_a_refusal_waits_in_memory_with_the_time_it_was_heard() -> None:
    now = [AT]
    r = RefusalRecorder(writer=lambda batch: None, clock=lambda: now[0])
    r.refusal(heard("req_a"))
    now[0] += 2.5
    r.refusal(heard("req_b", direction="answer"))
    assert [(at, rec.request_id) for at, rec in r.pending()] == [(AT, "req_a"), (AT + 2.5, "req_b")]


def test_a_flush_writes_every_field_and_never_a_text(db: Any) -> None:
    r = RefusalRecorder(clock=lambda: AT)
    r.refusal(heard("req_a"))
    r.refusal(heard("req_b", direction="answer", judge="", verdict="", categories=(),
                    score=None, judged=False, failures=(("judge", "timeout"),)))  # fmt: skip
    r.flush()
    assert r.pending() == []
    rows = {row["request_id"]: row for row in Refusal.objects.values()}
    a = rows["req_a"]
    assert a["at"] == dt.datetime.fromtimestamp(AT, tz=dt.UTC)
    assert {k: a[k] for k in ("direction", "model", "key", "owner", "judge", "verdict",
                              "categories", "score", "judged")} == {  # fmt: skip
        "direction": "request", "model": "chat", "key": "app", "owner": "team:t",
        "judge": "judge", "verdict": "unsafe", "categories": ["Violent"], "score": 0.97,
        "judged": True,
    }  # fmt: skip
    b = rows["req_b"]
    assert (b["direction"], b["judge"], b["score"], b["judged"]) == ("answer", "", None, False)
    assert a["failures"] == [] and b["failures"] == [{"judge": "judge", "kind": "timeout"}]
    # The model has no field a text could go in.
    assert {f.name for f in Refusal._meta.fields} == {
        "id", "at", "request_id", "direction", "model", "key", "owner", "judge", "verdict",
        "categories", "score", "judged", "failures",
    }  # fmt: skip


def test_a_failed_flush_puts_its_batch_back_ahead_of_what_came_since(db: Any) -> None:
    fail = [True]

    def writer(batch: list[Any]) -> None:
        if fail[0]:
            raise DataError("the database is away")
        write(batch)

    now = [AT]
    r = RefusalRecorder(writer=writer, clock=lambda: now[0])
    r.refusal(heard("req_1"))
    r.refusal(heard("req_2"))
    with pytest.raises(DataError):
        r.flush()
    now[0] += 1
    r.refusal(heard("req_3"))  # heard meanwhile
    assert [rec.request_id for _, rec in r.pending()] == ["req_1", "req_2", "req_3"]
    fail[0] = False
    r.flush()
    assert stored() == [("req_1", "request"), ("req_2", "request"), ("req_3", "request")]
    assert r.pending() == []


def test_a_batch_written_again_adds_no_second_row(db: Any) -> None:
    """A flush whose commit was not heard is put back and written again: the request id
    is unique, so the rows already there are skipped."""
    batch = [(AT, heard("req_1")), (AT, heard("req_2"))]
    write(batch)
    write([*batch, (AT + 1, heard("req_3"))])
    assert stored() == [("req_1", "request"), ("req_2", "request"), ("req_3", "request")]


def test_past_the_bound_new_refusals_are_dropped_counted_and_logged(
    db: Any, caplog: pytest.LogCaptureFixture
) -> None:
    fail = [True]
    arriving: list[str] = []

    def writer(batch: list[Any]) -> None:
        if fail[0]:
            for request_id in arriving:  # heard while the batch is out
                r.refusal(heard(request_id))
            arriving.clear()
            raise DataError("the database is away")
        write(batch)

    r = RefusalRecorder(writer=writer, clock=lambda: AT, max_pending=3)
    for i in range(5):
        r.refusal(heard(f"req_{i}"))
    assert [rec.request_id for _, rec in r.pending()] == ["req_0", "req_1", "req_2"]
    assert r.dropped == 2
    with caplog.at_level(logging.WARNING, logger="gateway.records.refusals"):
        arriving[:] = ["req_5", "req_6"]
        with pytest.raises(DataError):
            r.flush()
    assert "dropped 2 refusal records" in caplog.text  # logged as the batch was taken
    # Put back ahead of the two heard meanwhile, within the bound: those two are dropped.
    assert [rec.request_id for _, rec in r.pending()] == ["req_0", "req_1", "req_2"]
    assert r.dropped == 2
    caplog.clear()
    fail[0] = False
    with caplog.at_level(logging.WARNING, logger="gateway.records.refusals"):
        r.flush()
    assert stored() == [("req_0", "request"), ("req_1", "request"), ("req_2", "request")]
    assert "dropped 2 refusal records" in caplog.text and r.dropped == 0
    assert r.pending() == []


def test_no_record_can_fail_its_batch(db: Any) -> None:
    """What a judge or a name might hold is cut to its column and rid of NUL characters
    (PostgreSQL stores neither): a batch that failed would be put back and fail again."""
    write([(AT, heard("req_odd", judge="j" * 500 + "\x00", verdict="v" * 100, model="m" * 300,
                      categories=tuple(f"c\x00{i}" * 40 for i in range(80)), score=float("nan"),
                      direction="sideways"))])  # fmt: skip
    row = Refusal.objects.get(request_id="req_odd")
    assert len(row.judge) == 200 and "\x00" not in row.judge
    assert len(row.verdict) == 40 and len(row.model) == 200
    assert len(row.categories) == 50 and all(len(c) <= 100 and "\x00" not in c
                                             for c in row.categories)  # fmt: skip
    assert row.score is None and row.direction == "request"


def test_the_recorder_hears_refusals_only() -> None:
    from tests.gateway.test_usage import done

    r = RefusalRecorder(writer=lambda batch: None)
    r.request(done())
    r.retried("m")
    r.fell_back("m", "n")
    r.refused("request", "judge", ("Violent",))
    r.failed_open()
    r.unauthenticated()
    assert r.pending() == []
    assert not hasattr(r, "requests")  # a listener: it keeps no counts of its own


# Through the real Gateway: the record carries the id the client got.


class Judge:
    """A guard on requests and answers: refuses a request holding "forbidden" and an
    answer holding "UNSAFE"."""

    def directions(self) -> tuple[bool, bool]:
        return True, True

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        text = request if answer is None else answer
        if ("forbidden" if answer is None else "UNSAFE") in text:
            return {"decision": "refuse", "verdict": "unsafe", "judge": "j",
                    "categories": ["Violent"], "score": 0.91}  # fmt: skip
        return {"decision": "allow", "verdict": "safe", "judge": "j", "categories": []}


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(guard=Judge())
    yield harness
    harness.close()


def test_every_refusal_the_gateway_makes_is_recorded_by_its_request_id(
    h: Harness, transactional_db: Any
) -> None:
    safe = " ".join(f"safe{i}" for i in range(30))
    # A word every 50 ms: the guard's windows (150 ms) release the first words before
    # the marker is read.
    talker = h.engine("talker", behaviour="slow", say=f"{safe} UNSAFE and more")
    h.serve([model("m"), model("s")], [(1, "m", h.engine("plain")), (2, "s", talker)])
    recorder = RefusalRecorder(interval=0.05)
    h.gateway.observer = Fanout(recorder)
    recorder.start()
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    try:
        api.chat.completions.create(model="m", messages=[{"role": "user", "content": "hello"}])
        with pytest.raises(openai.BadRequestError) as caught:
            api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "something forbidden"}])  # fmt: skip
        assert caught.value.code == "content_filter"
        refused_request = caught.value.response.headers["x-request-id"]
        # A streamed answer refused after its first windows were released.
        with httpx.stream("POST", h.url + "/v1/chat/completions", timeout=10,
                          headers={"Authorization": f"Bearer {KEY}"},
                          json={"model": "s", "stream": True,
                                "messages": [{"role": "user", "content": "talk"}]}) as resp:  # fmt: skip
            raw = resp.read().decode()
            refused_answer = resp.headers["x-request-id"]
        assert resp.status_code == 200 and "safe0" in raw and "UNSAFE" not in raw
        assert "content_filter" in raw
        # The stream's refusal is heard as the gateway ends it, which may be just after
        # the client read its last bytes: wait for its record, then stop the recorder.
        wait_until(lambda: Refusal.objects.filter(request_id=refused_answer).exists(),
                   what="the refused answer's record")  # fmt: skip
    finally:
        recorder.stop()
    rows = {r.request_id: r for r in Refusal.objects.all()}
    assert set(rows) == {refused_request, refused_answer}
    request, answer = rows[refused_request], rows[refused_answer]
    assert (request.direction, request.model, request.key, request.owner) == (
        "request", "m", "harness", "team:t")  # fmt: skip
    assert (request.judge, request.verdict, request.categories, request.score, request.judged) == (
        "j", "unsafe", ["Violent"], 0.91, True)  # fmt: skip
    assert (answer.direction, answer.model) == ("answer", "s")


# Retention.


def test_the_job_deletes_records_older_than_the_days_kept(db: Any, settings: Any) -> None:
    now = timezone.now()
    for i, age in enumerate((0, 29, 31, 400)):
        Refusal.objects.create(at=now - dt.timedelta(days=age, minutes=1), request_id=f"req_{i}",
                               direction="request", key="app")  # fmt: skip
    settings.LLMGW_GATEWAY_REFUSAL_DAYS = 30
    assert tasks.prune_refusals() == 2  # the task beat sends, called as the worker would
    assert sorted(Refusal.objects.values_list("request_id", flat=True)) == ["req_0", "req_1"]
    assert tasks.prune_refusals() == 0
    assert prune(days=1, now=now) == 1
    assert list(Refusal.objects.values_list("request_id", flat=True)) == ["req_0"]


def test_the_job_deletes_a_large_backlog_in_chunks(db: Any, monkeypatch: Any) -> None:
    from gateway.records import refusals

    monkeypatch.setattr(refusals, "PRUNE_CHUNK", 7)
    old = timezone.now() - dt.timedelta(days=90)
    Refusal.objects.bulk_create(
        [Refusal(at=old, request_id=f"req_{i}", direction="answer", key="k") for i in range(23)]
    )
    Refusal.objects.create(at=timezone.now(), request_id="req_new", direction="answer", key="k")
    assert prune() == 23
    assert list(Refusal.objects.values_list("request_id", flat=True)) == ["req_new"]


def test_the_retention_job_is_a_periodic_job_at_its_interval(settings: Any) -> None:
    from llmgw_admin import jobs

    job = next(j for j in jobs.JOBS if j.task == "gateway.tasks.prune_refusals")
    assert job.interval == "LLMGW_GATEWAY_REFUSAL_PRUNE_INTERVAL"
    assert settings.CELERY_BEAT_SCHEDULE[job.name]["schedule"] == 3600.0
    assert settings.LLMGW_GATEWAY_REFUSAL_DAYS == 30


def test_fewer_than_one_day_kept_stops_the_start() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings",
           "LLMGW_GATEWAY_REFUSAL_DAYS": "0", "LLMGW_SECRET_KEY": "x"}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", "import django; django.setup()"],
                          cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode != 0
    assert "LLMGW_GATEWAY_REFUSAL_DAYS is 0: write 1 or more days" in done.stderr
