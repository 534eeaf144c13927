"""Bad input to the Files and Batch APIs through the real gateway (uvicorn, the ``openai``
client and raw HTTP): each a 4xx saying what is wrong, nothing kept, never a 500."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.harness import KEY, Harness, model


@pytest.fixture
def h(settings: Any, tmp_path: Path) -> Iterator[Harness]:
    settings.LLMGW_FILES_DIR = tmp_path / "files"
    settings.LLMGW_FILES_MAX_BYTES = 2000
    settings.LLMGW_FILES_MAX_LINES = 3
    harness = Harness()
    harness.serve([model("m")], [])
    yield harness
    harness.close()


LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {"model": "m"}}\n'


def test_bad_uploads_and_batches_are_told_what_is_wrong(h: Harness, tmp_path: Path) -> None:
    api = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=15)
    with pytest.raises(openai.BadRequestError, match="more than 3 lines"):
        api.files.create(file=("x.jsonl", LINE * 4), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="line 2: custom_id 'a' is used by line 1"):
        api.files.create(file=("x.jsonl", LINE * 2), purpose="batch")
    streamed = LINE.replace(b'"model": "m"', b'"model": "m", "stream": true')
    with pytest.raises(openai.BadRequestError) as stream:
        api.files.create(file=("x.jsonl", LINE + streamed.replace(b'"a"', b'"b"')), purpose="batch")
    message = stream.value.body["message"]  # type: ignore[index]
    assert "line 2: body.stream must be false or left out" in message and "line 1" not in message
    with pytest.raises(openai.BadRequestError, match="purpose must be 'batch'"):
        api.files.create(file=("x.jsonl", LINE), purpose="fine-tune")
    with pytest.raises(openai.APIStatusError) as big:
        api.files.create(file=("x.jsonl", LINE * 30), purpose="batch")
    assert big.value.status_code == 413
    assert list((tmp_path / "files").glob("**/*.data")) == []  # nothing kept
    with httpx.Client(base_url=h.url, headers={"Authorization": f"Bearer {KEY}"}) as http:
        form = http.post("/v1/files", json={"file": "x"})
        assert form.status_code == 400 and "multipart/form-data" in form.text
        assert http.put("/v1/files").status_code == 405
        assert http.post("/v1/batches", content=b"{").status_code == 400
        unknown = http.get("/v1/batches/batch_nope/results")
        assert unknown.status_code == 404 and "/v1/files and /v1/batches" in unknown.text
        assert http.get("/v1/files", headers={"Authorization": "Bearer nope"}).status_code == 401
    with pytest.raises(openai.NotFoundError, match="No file file-nope"):
        api.files.retrieve("file-nope")
    with pytest.raises(openai.NotFoundError, match="No batch batch_nope"):
        api.batches.retrieve("batch_nope")
    good = api.files.create(file=("x.jsonl", LINE), purpose="batch")
    assert good.expires_at == good.created_at + 30 * 86400  # LLMGW_FILES_KEEP days
    with pytest.raises(openai.BadRequestError, match="endpoint must be one of"):
        api.batches.create(input_file_id=good.id, endpoint="/v1/nope",  # type: ignore[arg-type]
                           completion_window="24h")  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="completion_window must be one of 24h"):
        api.batches.create(input_file_id=good.id, endpoint="/v1/embeddings",
                           completion_window="1h")  # type: ignore[arg-type]  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="names no file of purpose 'batch'"):
        api.batches.create(input_file_id="file-0000", endpoint="/v1/embeddings",
                           completion_window="24h")  # fmt: skip
    assert api.batches.list().data == []
    made = api.batches.create(input_file_id=good.id, endpoint="/v1/embeddings",
                              completion_window="24h", metadata={"k": "v"})  # fmt: skip
    assert made.status == "validating" and made.request_counts.total == 0
    assert api.batches.cancel(made.id).status == "cancelling"
    api.files.delete(good.id)
    with pytest.raises(openai.NotFoundError):
        api.files.content(good.id)
