"""A batch held to its models' schedule windows (``"schedule_window": true``), made with
the official ``openai`` client through the real gateway and run by the batch runner: no
line is sent while the model is outside its windows (the batch and the Batches page say
why); once the model's schedule has a window in force, the lines go and the batch ends."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog import codec, services
from catalog.choices import Surface
from gateway.batch import runner, store
from llmgw_admin import jobs
from tests.catalog.samples import cpu_model
from tests.catalog.samples import store as store_models
from tests.gateway.harness import KEY, Harness, model
from tests.waiting import wait_until


@pytest.fixture
def h(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    settings.LLMGW_FILES_DIR = tmp_path / "files"
    monkeypatch.setattr(runner, "REREAD", 0.1)  # the catalog read again at once
    monkeypatch.setattr(runner, "_parked", {})
    harness = Harness()
    yield harness
    harness.close()


@contextmanager
def runner_job() -> Iterator[None]:
    """The batch runner as the embedded web process runs it: ``run_next`` every interval
    (0.1 s here), in a thread of its own."""
    stop = threading.Event()
    thread = threading.Thread(target=jobs.every, args=(0.1, runner.run_next, stop), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def night(hours: tuple[int, int], name: str = "night") -> dict[str, Any]:
    """Model ``name`` with one schedule window, every day from hour to hour (UTC)."""
    return cpu_model(name, scaling={"min": 0, "max": 1, "schedule": [
        {"from": f"{hours[0]:02d}:00", "to": f"{hours[1]:02d}:00", "min": 1, "max": 1}]})  # fmt: skip


def rows_of(*names: str) -> bytes:
    """A batch file: a chat line a name, its custom_id the name and its place."""
    return "".join(
        f'{{"custom_id": "{name}{n}", "method": "POST", "url": "/v1/chat/completions", '
        f'"body": {{"model": "{name}", "messages": [{{"role": "user", "content": "hi"}}]}}}}\n'
        for n, name in enumerate(names, start=1)
    ).encode()


def test_a_held_batch_waits_for_its_models_window_and_runs_in_it(
    h: Harness, settings: Any, transactional_db: Any, client_for: Any, viewer: Any
) -> None:
    engine = h.engine("e")
    h.serve([model("night")], [(1, "night", engine)])
    settings.LLMGW_GATEWAY_URL = h.url
    hour = datetime.now(UTC).hour
    store_models(night(((hour + 3) % 24, (hour + 5) % 24)))  # not now: hours away
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
    rows = "".join(
        f'{{"custom_id": "r{n}", "method": "POST", "url": "/v1/chat/completions", "body": '
        f'{{"model": "night", "messages": [{{"role": "user", "content": "hi"}}]}}}}\n'
        for n in range(3)
    ).encode()
    file = api.files.create(file=("n.jsonl", rows), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="schedule_window must be true"):
        api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                           completion_window="24h", extra_body={"schedule_window": "yes"})  # fmt: skip
    batch = api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                               completion_window="24h", extra_body={"schedule_window": True})  # fmt: skip

    with runner_job():
        held = wait_until(lambda: store.get_batch(None, batch.id).get("held"), 30,
                          "the batch held")  # fmt: skip
        assert "waiting for a schedule window of model night" in held
        assert engine.requests == 0  # no line sent outside the window
        assert api.batches.retrieve(batch.id).status == "in_progress"
        page = client_for(viewer).get("/gateway/batches/").content.decode()
        assert "waiting for a schedule window of model night" in page

        # The operator opens a window in force now (the catalog's one write path).
        m, problems = codec.decode_model(night(((hour + 23) % 24, (hour + 2) % 24)))
        assert not problems
        services.save_model(m, services.Actor(user=None, surface=Surface.CLI, name="t"),
                            "night")  # fmt: skip
        done = wait_until(
            lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b,
            30, "the batch completed in the window")  # fmt: skip
    assert done.request_counts.completed == 3 and engine.requests == 3
    assert not store.get_batch(None, batch.id).get("held")


def test_each_line_of_a_held_batch_ends_named_by_an_alias_without_a_window_or_unknown(
    h: Harness, settings: Any, transactional_db: Any
) -> None:
    """A held batch's line naming an alias runs in its model's window; one whose model has
    no schedule window at all is an error line saying so at once; one naming no catalog
    model is sent, and the gateway's 404 is its result: the batch completes, nothing left
    waiting for its own window's end."""
    night_engine, plain_engine = h.engine("n"), h.engine("p")
    h.serve([model("night", aliases=["nightly"]), model("plain")],
            [(1, "night", night_engine), (2, "plain", plain_engine)])  # fmt: skip
    settings.LLMGW_GATEWAY_URL = h.url
    hour = datetime.now(UTC).hour
    in_force = night(((hour + 23) % 24, (hour + 2) % 24))
    store_models(dict(in_force, aliases=["nightly"]), cpu_model("plain"))
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
    rows = "".join(
        f'{{"custom_id": "{name}", "method": "POST", "url": "/v1/chat/completions", "body": '
        f'{{"model": "{name}", "messages": [{{"role": "user", "content": "hi"}}]}}}}\n'
        for name in ("nightly", "plain", "nowhere")
    ).encode()
    file = api.files.create(file=("n.jsonl", rows), purpose="batch")
    batch = api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                               completion_window="24h", extra_body={"schedule_window": True})  # fmt: skip
    worker = threading.Thread(target=runner.run_next, daemon=True)
    worker.start()
    done = wait_until(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b,
                      30, "the batch completed")  # fmt: skip
    worker.join(30)
    assert done.request_counts.completed == 1 and done.request_counts.failed == 2
    assert night_engine.requests == 1 and plain_engine.requests == 0
    out = [json.loads(x) for x in api.files.content(done.output_file_id).text.splitlines()]
    assert [o["custom_id"] for o in out] == ["nightly"]
    errors = {e["custom_id"]: e for e in (json.loads(x) for x in
              api.files.content(done.error_file_id).text.splitlines())}  # fmt: skip
    assert errors["plain"]["error"]["code"] == "no_schedule_window"
    assert "model plain has no schedule window" in errors["plain"]["error"]["message"]
    assert errors["nowhere"]["response"]["status_code"] == 404


def test_a_held_batchs_waiting_lines_hold_back_neither_other_models_lines_nor_other_batches(
    h: Harness, settings: Any, transactional_db: Any
) -> None:
    """A held batch whose first line's model waits for its window hours away: its lines
    for a model inside its window are answered meanwhile, a batch made after it runs to its
    end, and once the first model's window opens its lines go and the batch completes, its
    output in line order."""
    night_engine, day_engine = h.engine("n"), h.engine("d")
    h.serve([model("night"), model("day")], [(1, "night", night_engine), (2, "day", day_engine)])
    settings.LLMGW_GATEWAY_URL = h.url
    hour = datetime.now(UTC).hour
    in_force = ((hour + 23) % 24, (hour + 2) % 24)
    store_models(night(((hour + 3) % 24, (hour + 5) % 24)), night(in_force, "day"))
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
    held_file = api.files.create(file=("h.jsonl", rows_of("night", "day", "night", "day")),
                                 purpose="batch")  # fmt: skip
    held = api.batches.create(input_file_id=held_file.id, endpoint="/v1/chat/completions",
                              completion_window="24h", extra_body={"schedule_window": True})  # fmt: skip
    later_file = api.files.create(file=("l.jsonl", rows_of("day", "day")), purpose="batch")
    later = api.batches.create(input_file_id=later_file.id, endpoint="/v1/chat/completions",
                               completion_window="24h")  # fmt: skip

    with runner_job():
        wait_until(lambda: api.batches.retrieve(later.id).status == "completed", 30,
                   "the later batch completed beside the held one")  # fmt: skip
        wait_until(lambda: api.batches.retrieve(held.id).request_counts.completed == 2, 30,
                   "the held batch's lines for day answered")  # fmt: skip
        assert night_engine.requests == 0 and day_engine.requests == 4
        assert api.batches.retrieve(held.id).status == "in_progress"
        assert "waiting for a schedule window of model night" in store.get_batch(
            None, held.id)["held"]  # fmt: skip

        m, problems = codec.decode_model(night(in_force))
        assert not problems
        services.save_model(m, services.Actor(user=None, surface=Surface.CLI, name="t"),
                            "night")  # fmt: skip
        done = wait_until(
            lambda: (b := api.batches.retrieve(held.id)).status == "completed" and b,
            30, "the held batch completed in night's window")  # fmt: skip
    assert done.request_counts.completed == 4 and night_engine.requests == 2
    out = [json.loads(x)["custom_id"] for x in
           api.files.content(done.output_file_id).text.splitlines()]  # fmt: skip
    assert out == ["night1", "day2", "night3", "day4"]
    assert not store.get_batch(None, held.id).get("held")
