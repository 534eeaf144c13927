"""Everything of an answer a client would read is judged: tool calls' arguments, chunks
that are not JSON. The real guard (a sim judge process) through the real gateway."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.guarding import Guard
from gateway.state import State
from guard import records
from guard import services as guard_services
from tests.catalog.samples import store
from tests.gateway.harness import Harness
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def judge_url() -> Iterator[str]:
    judge, url = launch("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "0",
                        "--tps", "100000")  # fmt: skip
    yield url
    stop(judge)


def gateway_for(judge_url: str, behaviour: str) -> tuple[Harness, str]:
    h = Harness(state=State(), guard=Guard())
    engine_url = h.engine("e", behaviour=behaviour, say="look UNSAFE-MARKER here").url
    guard_model("judge", endpoint=judge_url)
    store({"name": "chat", "source": "sim/chat", "scaling": {"min": 1, "max": 1},
           "capabilities": {"tools": True},
           "profiles": [{"name": "sim", "engine": "sim", "gpu_class": "nvidia-h100-80gb"}]})  # fmt: skip
    Replica.objects.create(model_name="chat", state="ready", endpoint=engine_url, profile="sim")
    guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": ["answers"],
                               "fail": "closed"}, surface="cli")  # fmt: skip
    _, secret = keys.create_key("k")
    records.start()
    return h, secret


@pytest.mark.parametrize("behaviour", ["tools", "garbled"])
def test_an_unsafe_answer_hidden_where_text_is_not_expected_is_refused(
    judge_url: str, behaviour: str
) -> None:
    gw, secret = gateway_for(judge_url, behaviour)
    try:
        gw.serve([], [])
        stream = behaviour == "garbled"
        body = {"model": "chat", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=20,
                       headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
        assert "UNSAFE" not in r.text and "MARKER" not in r.text
        assert "content_filter" in r.text
    finally:
        gw.close()
        records.RECORDER.stop()
