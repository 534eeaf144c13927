"""A model no node of the cluster could ever run: the gateway answers
503 ``model_unplaceable`` at once, naming what is missing, with no ``Retry-After`` and
``x-should-retry: false``, so the official client does not retry what cannot succeed.
The reconciler's reason reaches the gateway as ``Replica.reason`` (tests/e2e covers that
path with real processes); here the gateway's own answer, through the ``openai`` client.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from cluster.placement import UNPLACEABLE
from tests.gateway.harness import KEY, Harness, model


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


def counting_client(h: Harness, sent: list[str]) -> openai.OpenAI:
    hooks = {"request": [lambda request: sent.append(request.url.path)]}
    # The client's default retries (2): only the gateway's answer keeps it to one request.
    return openai.OpenAI(
        base_url=h.url + "/v1", api_key=KEY, timeout=10, http_client=httpx.Client(event_hooks=hooks)
    )


def test_a_model_no_node_can_run_is_503_model_unplaceable_and_not_retried(h: Harness) -> None:
    h.gateway.options.wake_wait = 60
    h.unplaced = {"m": f"{UNPLACEABLE}: no node has nvidia-a100-80gb cards"}
    h.serve([model("m")], [])
    sent: list[str] = []
    with pytest.raises(openai.InternalServerError) as caught:
        counting_client(h, sent).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    error = caught.value
    assert error.status_code == 503
    assert error.code == "model_unplaceable"
    assert "No node in this cluster can run 'm': no node has " in error.message
    assert "nvidia-a100-80gb cards" in error.message
    assert "try again" not in error.message.lower()
    assert "retry-after" not in error.response.headers
    assert error.response.headers["x-should-retry"] == "false"
    assert sent == ["/v1/chat/completions"]  # asked once: nothing invited a retry


def test_a_model_waiting_for_room_still_invites_a_retry(h: Harness) -> None:
    h.gateway.options.wake_wait = 60
    h.unplaced = {"m": "needs 1 free nvidia-a100-80gb on one node; the best node has 0"}
    h.serve([model("m")], [])
    sent: list[str] = []
    client = counting_client(h, sent).with_options(max_retries=0)
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.code == "model_unavailable"
    assert caught.value.response.headers["retry-after"] == "30"
