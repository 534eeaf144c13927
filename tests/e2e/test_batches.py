"""The Files and Batch APIs as OpenAI's client meets them: ``manage.py serve`` (its
embedded batch runner sending each line through the gateway itself), a real agent and sim
engines."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from cluster.models import Node
from tests.catalog.samples import store
from tests.e2e.conftest import Agent, ControlPlane, wait_for
from tests.e2e.test_gateway import H100, client, new_key, ready, set_policy, sim_model

pytestmark = pytest.mark.e2e


@pytest.fixture
def control_plane(transactional_db: Any, tmp_path: Path) -> Iterator[ControlPlane]:
    """The web process, its batch runner looking for work every second."""
    cp = ControlPlane(tmp_path)
    cp.extra = {"LLMGW_BATCH_INTERVAL": "1", "LLMGW_BATCH_CONCURRENCY": "4"}
    cp.start()
    yield cp
    cp.stop()


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def chat_line(n: int, model: str = "chat") -> dict[str, Any]:
    return {"custom_id": f"req-{n}", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "max_tokens": 16,
                     "messages": [{"role": "user", "content": f"/echo line {n}"}]}}  # fmt: skip


def lines_of(api: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(t) for t in api.files.content(file_id).text.splitlines()]


def test_a_batch_of_100_lines_and_a_file_refused_and_a_cancel(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    agents("bt-a", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("chat", context_length=4096, max_output=512))
    wait_for(ready("chat"), 90, "the chat replica ready")
    key = new_key(control_plane, "batcher", "--owner", "team:batch")
    api = client(control_plane, key, timeout=60)

    # A file with bad lines is refused, naming each.
    rows = [chat_line(n) for n in range(1, 6)]
    bad = jsonl(rows[:2]) + b"{not json\n" + jsonl([{**rows[3], "url": "/v1/nope"}, rows[0]])
    with pytest.raises(openai.BadRequestError) as refused:
        api.files.create(file=("bad.jsonl", bad), purpose="batch")
    message = refused.value.body["message"]  # type: ignore[index]
    assert "line 3: not JSON" in message
    assert "line 4: url '/v1/nope'" in message
    assert "line 5: custom_id 'req-1' is used by line 1 too" in message
    assert api.files.list().data == []  # nothing kept

    # 100 lines: uploaded, run, every answer in the output file under its custom_id.
    uploaded = api.files.create(file=("in.jsonl", jsonl([chat_line(n) for n in range(1, 101)])),
                                purpose="batch")  # fmt: skip
    assert uploaded.purpose == "batch" and uploaded.bytes > 0
    assert api.files.retrieve(uploaded.id).filename == "in.jsonl"
    batch = api.batches.create(input_file_id=uploaded.id, endpoint="/v1/chat/completions",
                               completion_window="24h", metadata={"run": "nightly"})  # fmt: skip
    assert batch.status == "validating"
    done = wait_for(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b,
                    120, "the batch completed")  # fmt: skip
    assert done.request_counts.total == 100
    assert done.request_counts.completed == 100 and done.request_counts.failed == 0
    assert done.metadata == {"run": "nightly"} and done.error_file_id is None
    out = lines_of(api, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{n}" for n in range(1, 101))
    for o in out:
        assert o["response"]["status_code"] == 200
        n = o["custom_id"].removeprefix("req-")
        assert o["response"]["body"]["choices"][0]["message"]["content"] == f"line {n}"
    assert batch.id in [b.id for b in api.batches.list().data]
    # Another owner sees none of it.
    other = client(control_plane, new_key(control_plane, "else", "--owner", "team:other"))
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(uploaded.id)

    # A second model, slow enough to cancel a batch of it mid-way.
    store(sim_model("slow", context_length=4096, max_output=512,
                    profile={"env": {"LLMGW_SIM_TTFT": "0.4", "LLMGW_SIM_TPS": "50"}}))  # fmt: skip
    wait_for(ready("slow"), 90, "the slow replica ready")
    # A key that may not name the model: each line is refused (an error line), the batch ends.
    scoped = new_key(control_plane, "scoped", "--owner", "team:batch", "--model", "slow")
    scoped_api = client(control_plane, scoped, timeout=60)
    two = scoped_api.files.create(file=("two.jsonl", jsonl([chat_line(1), chat_line(2)])),
                                  purpose="batch")  # fmt: skip
    refused_batch = scoped_api.batches.create(input_file_id=two.id, completion_window="24h",
                                              endpoint="/v1/chat/completions")  # fmt: skip
    ended = wait_for(lambda: (b := scoped_api.batches.retrieve(refused_batch.id)).status
                     == "completed" and b, 60, "the refused batch ended")  # fmt: skip
    assert ended.request_counts.failed == 2 and ended.output_file_id is None
    errors = lines_of(scoped_api, ended.error_file_id)
    assert {e["response"]["status_code"] for e in errors} == {404}
    assert {e["response"]["body"]["error"]["code"] for e in errors} == {"model_not_found"}

    # Cancel mid-way: what finished is kept, the rest never runs.
    many = api.files.create(file=("slow.jsonl", jsonl([chat_line(n, "slow") for n in range(1, 201)])),
                            purpose="batch")  # fmt: skip
    slow = api.batches.create(input_file_id=many.id, endpoint="/v1/chat/completions",
                              completion_window="24h")  # fmt: skip
    wait_for(lambda: api.batches.retrieve(slow.id).request_counts.completed >= 4, 60,
             "some lines done")  # fmt: skip
    asked = api.batches.cancel(slow.id)
    assert asked.status in ("cancelling", "cancelled")
    cancelled = wait_for(lambda: (b := api.batches.retrieve(slow.id)).status == "cancelled" and b,
                         60, "the batch cancelled")  # fmt: skip
    finished = cancelled.request_counts.completed
    assert 4 <= finished < 200
    kept = lines_of(api, cancelled.output_file_id)
    assert len(kept) == finished
    assert len({o["custom_id"] for o in kept}) == finished


def test_a_refused_line_names_the_judge_and_a_killed_runner_resumes_each_line_once(
    control_plane: ControlPlane, agents: Callable[..., Agent]
) -> None:
    cp = control_plane
    agents("bt-b", "--simulate", f"2x {H100}", "--stop-engines-on-exit")
    wait_for(lambda: Node.objects.filter(health="ready").exists(), 60, "the node")
    store(sim_model("chat", context_length=4096, max_output=512,
                    profile={"env": {"LLMGW_SIM_TTFT": "0.3", "LLMGW_SIM_TPS": "50"}}),
          sim_model("judge", role="guard", guard={"format": "qwen3guard"}))  # fmt: skip
    wait_for(ready("chat"), 90, "the chat replica ready")
    wait_for(ready("judge"), 90, "the judge ready")
    set_policy(cp, "--judges", "judge", "--directions", "requests", "--fail", "closed")
    key = new_key(cp, "batcher", "--owner", "team:batch")
    api = client(cp, key, timeout=60)

    # A line the judge refuses is an error line naming it; the others are answered.
    unsafe = chat_line(2)
    unsafe["body"]["messages"][0]["content"] = "UNSAFE-MARKER please"  # type: ignore[index]
    three = api.files.create(file=("g.jsonl", jsonl([chat_line(1), unsafe, chat_line(3)])),
                             purpose="batch")  # fmt: skip
    judged = api.batches.create(input_file_id=three.id, endpoint="/v1/chat/completions",
                                completion_window="24h")  # fmt: skip
    ended = wait_for(lambda: (b := api.batches.retrieve(judged.id)).status == "completed" and b,
                     60, "the judged batch ended")  # fmt: skip
    assert (ended.request_counts.completed, ended.request_counts.failed) == (2, 1)
    (refused,) = lines_of(api, ended.error_file_id)
    assert refused["custom_id"] == "req-2"
    assert refused["response"]["status_code"] == 400
    error = refused["response"]["body"]["error"]
    assert error["code"] == "content_filter" and "judge 'judge'" in error["message"]
    assert [o["custom_id"] for o in lines_of(api, ended.output_file_id)] == ["req-1", "req-3"]

    # The process running the batch killed mid-way, started again: each line answered once.
    file = api.files.create(file=("k.jsonl", jsonl([chat_line(n) for n in range(1, 61)])),
                            purpose="batch")  # fmt: skip
    batch = api.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                               completion_window="24h")  # fmt: skip
    before = wait_for(lambda: (n := api.batches.retrieve(batch.id).request_counts.completed) >= 8
                      and n, 60, "some lines done")  # fmt: skip
    assert cp.proc is not None
    cp.proc.kill()  # SIGKILL: no chance to tidy up
    cp.proc.wait()
    kept = cp.tmp / "data" / "files" / "batches"
    at_kill = json.loads((kept / f"{batch.id}.json").read_text())
    assert at_kill["status"] == "in_progress"
    assert before <= at_kill["request_counts"]["completed"] < 60
    cp.start()
    done = wait_for(lambda: (b := api.batches.retrieve(batch.id)).status == "completed" and b,
                    120, "the batch completed after the restart")  # fmt: skip
    assert done.request_counts.completed == 60 and done.request_counts.failed == 0
    out = lines_of(api, done.output_file_id)
    assert sorted(o["custom_id"] for o in out) == sorted(f"req-{n}" for n in range(1, 61))
    # Its journal holds each line once: none lost, none written twice.
    journal = [
        json.loads(t)["line"] for t in (kept / f"{batch.id}.journal").read_text().splitlines()
    ]
    assert sorted(journal) == list(range(1, 61))
