"""Whether a batch's lines are load for scaling, through the real gateway (uvicorn, the
``openai`` client, the batch runner): by default they run on the replicas there are, left
out of the load report the reconciler scales on; a batch made with ``scale_up`` counts as
load, so scaling may add replicas for it (up to the model's max)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.batch import runner
from gateway.records.loadreport import LoadReport
from tests.gateway.harness import KEY, Harness, model
from tests.waiting import wait_until

LINE = (b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": '
        b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}}\n')  # fmt: skip


@pytest.fixture
def h(settings: Any, tmp_path: Path) -> Iterator[Harness]:
    settings.LLMGW_FILES_DIR = tmp_path / "files"
    harness = Harness()
    yield harness
    harness.close()


def test_a_batchs_lines_are_load_for_scaling_only_when_it_says_so(
    h: Harness, settings: Any
) -> None:
    engine = h.engine("e", delay=1.5)  # a line in flight long enough to be seen
    h.serve([model("m")], [(1, "m", engine)])
    settings.LLMGW_GATEWAY_URL = h.url
    report = LoadReport(h.gateway.parts, "p")
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
    file = api.files.create(file=("a.jsonl", LINE), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="scale_up must be true"):
        api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                           completion_window="24h", extra_body={"scale_up": 1})  # fmt: skip

    seen = {}
    for scale in (False, True):
        batch = api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                   completion_window="24h",
                                   extra_body={"scale_up": True} if scale else None)  # fmt: skip
        worker = threading.Thread(target=runner.run_next, daemon=True)
        worker.start()
        wait_until(lambda: h.gateway.in_flight, 30, "the batch's line in flight")
        seen[scale] = report.in_flight_now()
        worker.join(30)
        assert api.batches.retrieve(batch.id).status == "completed"
    assert seen == {False: {}, True: {"m": 1}}
    # A live request is load, as ever.
    live = threading.Thread(target=lambda: api.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]))  # fmt: skip
    live.start()
    wait_until(lambda: h.gateway.in_flight, 30, "the live request in flight")
    assert report.in_flight_now() == {"m": 1}
    live.join(30)
