"""The Batches page in Chromium as an operator watches it: a batch made with the official
``openai`` client through a real gateway (uvicorn, engines answering over HTTP), run by the
batch runner, its counts moving to ``completed`` on the page without a reload; another
cancelled from the page, what finished kept."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway import views
from gateway.batch import runner
from tests.browser.conftest import wait_js
from tests.gateway.harness import KEY, Harness, model
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

ROW = "(id) => { const r = document.querySelector(`tr[data-batch='${id}']`); return r && {" \
      "status: r.dataset.status, done: r.querySelector('[data-role=done]').textContent, " \
      "errors: r.querySelector('[data-role=errors]').textContent} }"  # fmt: skip


@pytest.fixture
def h(settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    settings.LLMGW_FILES_DIR = tmp_path / "files"
    settings.LLMGW_BATCH_CONCURRENCY = 1
    monkeypatch.setattr(views, "BATCHES_FAST_S", 1)
    monkeypatch.setattr(views, "BATCHES_SLOW_S", 1)
    harness = Harness()
    fast, slow = harness.engine("fast", delay=0.25), harness.engine("slow", delay=0.5)
    harness.serve([model("m"), model("s")], [(1, "m", fast), (2, "s", slow)])
    settings.LLMGW_GATEWAY_URL = harness.url
    yield harness
    harness.close()


def jsonl(model_name: str, n: int) -> bytes:
    rows = [{"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": model_name, "messages": [{"role": "user", "content": "hi"}]}}
            for i in range(1, n + 1)]  # fmt: skip
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def run_in_background() -> threading.Thread:
    """The batch runner as a worker runs it: the oldest batch not ended, to its end."""
    thread = threading.Thread(target=runner.run_next, daemon=True)
    thread.start()
    return thread


def test_a_batchs_counts_move_to_completed_and_another_is_cancelled_from_the_page(
    h: Harness, open_page: Any, operator: Any, settings: Any
) -> None:
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    page = open_page(operator, "/gateway/batches/")
    page.evaluate("window.notReloaded = true")
    assert page.locator("#batches").inner_text().count("No batch yet") == 1

    # 19 lines of a served model and one naming no model: an error line.
    data = jsonl("m", 19) + jsonl("nope", 1).replace(b"req-1", b"req-20")
    uploaded = api.files.create(file=("in.jsonl", data), purpose="batch")
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                               completion_window="24h")  # fmt: skip
    # The new batch shows up on the open page, waiting.
    wait_js(page, ROW, batch.id, timeout=20, what="the new batch on the page")
    worker = run_in_background()
    seen: set[str] = set()

    def moved() -> bool:
        row = page.evaluate(ROW, batch.id)
        seen.add(row["done"])
        return row["status"] == "completed"

    wait_until(moved, 60, "the batch completed on the page")
    worker.join(30)
    row = page.evaluate(ROW, batch.id)
    assert row["done"].strip() == "20 / 20 (100 %)" and row["errors"].strip() == "1"
    # The counts moved on the page as lines finished, not only at the end.
    between = {s for s in seen if not s.startswith(("0 /", "20 /"))}
    assert between, f"only saw {seen}"
    kinds = page.locator(f"tr[data-errors-of='{batch.id}'] [data-role=error-kinds]")
    assert "model_not_found × 1" in kinds.inner_text()
    assert page.evaluate("window.notReloaded === true")  # no reload: the table was swapped
    assert api.batches.retrieve(batch.id).request_counts.completed == 19

    # Another, on a slower model: cancelled from the page once some lines are done.
    settings.LLMGW_BATCH_CONCURRENCY = 2
    many = api.files.create(file=("slow.jsonl", jsonl("s", 100)), purpose="batch")
    slow = api.batches.create(input_file_id=many.id, endpoint="/v1/chat/completions",
                              completion_window="24h")  # fmt: skip
    worker = run_in_background()
    wait_js(page, f"(() => {{ const r = ({ROW})({json.dumps(slow.id)}); "
                  "return r && parseInt(r.done) >= 2 })()",
            timeout=60, what="some lines of the slow batch done")  # fmt: skip
    page.on("dialog", lambda d: d.accept())
    page.locator(f"tr[data-batch='{slow.id}'] [data-role=cancel]").click()
    notice = page.locator("[data-role=notice]")
    assert "is cancelling: what finished is kept" in notice.inner_text()
    wait_js(page, f"(() => {{ const r = ({ROW})({json.dumps(slow.id)}); "
                  "return r && r.status === 'cancelled' })()",
            timeout=60, what="the slow batch cancelled on the page")  # fmt: skip
    worker.join(30)
    assert not worker.is_alive()
    ended = api.batches.retrieve(slow.id)
    assert ended.status == "cancelled"
    assert 2 <= ended.request_counts.completed < 100
    row = page.evaluate(ROW, slow.id)
    assert row["done"].startswith(f"{ended.request_counts.completed} / 100")
    assert page.locator(f"tr[data-batch='{slow.id}'] [data-role=cancel]").count() == 0
    assert page.evaluate("window.notReloaded === true")
    assert page.errors == []
