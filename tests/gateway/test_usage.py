"""Usage written off the request path in batches: exact with several processes flushing at
once, nothing lost by a stop, and every request the real Gateway serves counted."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from django.db.models import Sum

from gateway.models import Usage
from gateway.records.observe import Done, Fanout
from gateway.records.usage import Counts, UsageRecorder, write
from tests.dburl import database_url
from tests.gateway.harness import KEY, Harness, model
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
MINUTE = 1_800_000_000 // 60 * 60  # a minute's start, as Unix seconds


def done(key: str = "app", status: int = 200, model_name: str = "m", **kw: Any) -> Done:
    values: dict[str, Any] = {"model": model_name, "status": status, "owner": "team:t", "key": key,
                              "seconds": 0.1, "ttft": 0.05, "tokens_in": 3, "tokens_out": 5,
                              "replica": 1, "stream": False}  # fmt: skip
    values.update(kw)
    return Done(**values)


def totals(**filters: Any) -> dict[str, int]:
    got = Usage.objects.filter(**filters).aggregate(
        requests=Sum("requests"), errors=Sum("errors"), tokens_in=Sum("tokens_in"),
        tokens_out=Sum("tokens_out"), refusals=Sum("refusals"),
    )  # fmt: skip
    return {k: v or 0 for k, v in got.items()}


def test_a_request_is_counted_in_its_minutes_bucket() -> None:
    now = [MINUTE + 59.9]
    r = UsageRecorder(writer=lambda batch: None, clock=lambda: now[0])
    r.request(done())
    r.request(done(status=503, tokens_in=0, tokens_out=0))
    r.request(done(status=499))  # the client went away: a request, no error
    now[0] = MINUTE + 60
    r.request(done(model_name="other"))
    r.request(done(status=400))
    assert r.pending() == {
        (MINUTE, "app", "team:t", "m"): Counts(3, 1, 6, 10, 0),
        (MINUTE + 60, "app", "team:t", "other"): Counts(1, 0, 3, 5, 0),
        (MINUTE + 60, "app", "team:t", "m"): Counts(1, 1, 3, 5, 0),
    }


def test_a_failed_flush_puts_its_counts_back(db: Any) -> None:
    fail = [True]

    def writer(batch: dict[Any, Counts]) -> None:
        if fail[0]:
            raise RuntimeError("the database is away")
        write(batch)

    r = UsageRecorder(writer=writer, clock=lambda: MINUTE)
    for _ in range(3):
        r.request(done())
    with pytest.raises(RuntimeError):
        r.flush()
    r.request(done())  # gathered meanwhile
    fail[0] = False
    r.flush()
    assert totals() == {"requests": 4, "errors": 0, "tokens_in": 12, "tokens_out": 20,
                        "refusals": 0}  # fmt: skip
    assert r.pending() == {}


def test_two_recorders_flushing_at_once_count_exactly(transactional_db: Any) -> None:
    recorders = [UsageRecorder(interval=0.005, clock=lambda: MINUTE) for _ in range(2)]
    for r in recorders:
        r.start()
    per_thread = 400

    def serve(r: UsageRecorder, n: int) -> None:
        for i in range(per_thread):
            r.request(done(key=f"k{i % 3}", status=500 if i % 10 == 0 else 200))

    threads = [threading.Thread(target=serve, args=(r, n)) for r in recorders for n in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in recorders:
        r.stop()
    requests = 4 * per_thread
    assert totals() == {"requests": requests, "errors": requests // 10,
                        "tokens_in": 3 * requests, "tokens_out": 5 * requests,
                        "refusals": 0}  # fmt: skip
    # One row per bucket, whatever the number of processes and flushes.
    assert Usage.objects.count() == 3
    row = Usage.objects.get(key="k0")
    assert row.minute == dt.datetime.fromtimestamp(MINUTE, tz=dt.UTC) and row.model == "m"


def test_a_stopped_gateway_process_writes_what_it_gathered(transactional_db: Any) -> None:
    """SIGTERM, as a restart sends it: the server's exit writes what is left (atexit)."""
    script = (
        "import django, signal, sys, time; django.setup()\n"
        "from gateway import server\n"
        "from gateway.records import usage\n"
        "from gateway.records.observe import Done\n"
        "signal.signal(signal.SIGTERM, server._exit)\n"
        "usage.RECORDER.interval = 3600  # only the exit writes\n"
        "usage.RECORDER.start()\n"
        "for _ in range(37):\n"
        "    usage.RECORDER.request(Done('m', 200, 'team:t', 'app', 0.1, 0.05, 3, 5, 1, False))\n"
        "print('gathered', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings",
        "LLMGW_DATABASE_URL": database_url(),
        "LLMGW_SECRET_KEY": "test-only-not-secret",
    }
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "gathered"
        assert not Usage.objects.exists()  # nothing written yet
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert totals()["requests"] == 37 and totals()["tokens_out"] == 185


# Through the real Gateway.


class RefuseForbidden:
    """A guard that refuses requests holding "forbidden"."""

    def directions(self) -> tuple[bool, bool]:
        return True, False

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        if "forbidden" in request:
            return {"decision": "refuse", "verdict": "unsafe", "judge": "j",
                    "categories": ["Violent"]}  # fmt: skip
        return {"decision": "allow", "verdict": "safe", "judge": "j", "categories": []}


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness(guard=RefuseForbidden())
    yield harness
    harness.close()


def test_every_request_the_gateway_serves_is_counted(h: Harness, transactional_db: Any) -> None:
    good, down = h.engine("good"), h.engine("down", behaviour="503")
    streams = h.engine("streams")
    h.serve([model("m"), model("s"), model("broken")],
            [(1, "m", good), (2, "broken", down), (3, "s", streams)])  # fmt: skip
    recorder = UsageRecorder(interval=0.05)
    h.gateway.observer = Fanout(recorder)
    recorder.start()
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    n = 40
    try:
        for i in range(n):
            messages = [{"role": "user", "content": f"hello {i}"}]
            api.chat.completions.create(model="m", messages=messages)
            if i % 4 == 0:
                list(api.chat.completions.create(model="s", messages=messages, stream=True))
        with pytest.raises(openai.BadRequestError):
            api.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "something forbidden"}])  # fmt: skip
        with pytest.raises(openai.APIStatusError):
            api.chat.completions.create(model="broken", messages=[{"role": "user", "content": "x"}])
        # The gateway hands a request to its recorders once its answer is sent, so the
        # client may have its error first: the last one is waited for, written.
        wait_until(lambda: totals(model="broken")["requests"] == 1, 10, "the last request counted")
    finally:
        recorder.stop()
    assert totals(model="m") == {"requests": n + 1, "errors": 0, "tokens_in": 3 * n,
                                 "tokens_out": 5 * n, "refusals": 1}  # fmt: skip
    streamed = n // 4  # their usage asked of the engine, though the client did not
    assert totals(model="s") == {"requests": streamed, "errors": 0, "tokens_in": 3 * streamed,
                                 "tokens_out": 5 * streamed, "refusals": 0}  # fmt: skip
    assert totals(model="broken") == {"requests": 1, "errors": 1, "tokens_in": 0,
                                      "tokens_out": 0, "refusals": 0}  # fmt: skip
    assert set(Usage.objects.values_list("key", "owner")) == {("harness", "team:t")}


# The API.


def test_viewers_list_usage_newest_first_and_filter_it(
    db: Any, viewer: Any, outsider: Any, api_for: Any
) -> None:
    write({(MINUTE, "app", "team:t", "m"): Counts(3, 1, 30, 50, 1),
           (MINUTE + 60, "app", "team:t", "m"): Counts(2, 0, 20, 40, 0),
           (MINUTE + 60, "other", "", "m"): Counts(1, 0, 1, 1, 0)})  # fmt: skip
    api = api_for(viewer)
    listed = api.get("/api/v1/gateway/usage/")
    assert listed.status_code == 200
    rows = listed.json()["results"]
    assert [(r["key"], r["requests"]) for r in rows] == [("app", 2), ("other", 1), ("app", 3)]
    assert rows[2] == {"minute": "2027-01-15T08:00:00Z", "key": "app", "owner": "team:t",
                       "model": "m", "requests": 3, "errors": 1, "tokens_in": 30,
                       "tokens_out": 50, "tokens_cached": 0, "refusals": 1,
                       "batch_requests": 0}  # fmt: skip
    only = api.get("/api/v1/gateway/usage/", {"key": "app", "minute__lt": rows[0]["minute"]})
    assert [r["requests"] for r in only.json()["results"]] == [3]
    bad = api.get("/api/v1/gateway/usage/", {"minute__gte": "yesterday"})
    assert bad.status_code == 400 and bad.json()["errors"][0]["field"] == "minute__gte"
    assert api_for(outsider).get("/api/v1/gateway/usage/").status_code == 403
    assert api.post("/api/v1/gateway/usage/", {}).status_code in (403, 405)
