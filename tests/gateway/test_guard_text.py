"""Everything of an answer a client would read is judged: tool calls' arguments, chunks
that are not JSON. The real guard (a sim judge process) through the real gateway."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from cluster.models import Replica
from gateway import services as keys
from gateway.path.guarding import Guard
from gateway.records.state import State
from guard import records
from guard import services as guard_services
from tests.catalog.samples import sim_model, store
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


def gateway_for(
    judge_url: str, behaviour: str, say: str = "look UNSAFE-MARKER here",
    judge_context: int | None = None, directions: tuple[str, ...] = ("answers",),
) -> tuple[Harness, str]:  # fmt: skip
    h = Harness(state=State(), guard=Guard())
    engine_url = h.engine("e", behaviour=behaviour, say=say).url
    guard_model("judge", endpoint=judge_url, context_length=judge_context)
    store(sim_model("chat", tp=None, capabilities={"tools": True}))
    Replica.objects.create(model_name="chat", state="ready", endpoint=engine_url, profile="sim")
    guard_services.set_policy({"judge": {"models": ["judge"]}, "directions": list(directions),
                               "fail": "closed"}, surface="cli")  # fmt: skip
    _, secret = keys.create_key("k")
    records.start()
    return h, secret


@pytest.mark.parametrize(
    ("behaviour", "stream"),
    [
        ("tools", False),
        ("garbled", True),
        ("nested", True),
        ("toolname", False),
        ("toolname", True),
    ],
)
def test_an_unsafe_answer_hidden_where_text_is_not_expected_is_refused(
    judge_url: str, behaviour: str, stream: bool
) -> None:
    """Tool calls' arguments and names (a name is text the client reads, and acts on),
    events that are not JSON, JSON nested past a parser's depth."""
    gw, secret = gateway_for(judge_url, behaviour)
    try:
        gw.serve([], [])
        body = {"model": "chat", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=20,
                       headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
        assert "UNSAFE" not in r.text and "MARKER" not in r.text
        assert "content_filter" in r.text
    finally:
        gw.close()
        records.RECORDER.stop()


# An answer far longer than its judge's context (1024 tokens): the judge reads a text's
# start and end, so the marker in the middle was never judged, and was released.
FILLER = " ".join(f"w{i}" for i in range(1500))
LONG = f"{FILLER} UNSAFE-MARKER {FILLER}"


@pytest.mark.parametrize("behaviour", ["ok", "nested"])
def test_the_middle_of_an_answer_too_long_for_its_judge_is_judged(
    judge_url: str, behaviour: str
) -> None:
    """A whole answer, and a stream whose one event holds it all, are judged in parts
    when the judge could read only their start and end: the marker is refused."""
    gw, secret = gateway_for(judge_url, behaviour, say=LONG, judge_context=1024)
    try:
        gw.serve([], [])
        stream = behaviour == "nested"
        body = {"model": "chat", "stream": stream, "messages": [{"role": "user", "content": "x"}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
        assert "MARKER" not in r.text and "content_filter" in r.text
        assert "w1000" not in r.text  # nothing of the answer went out
    finally:
        gw.close()
        records.RECORDER.stop()


def test_a_long_safe_answer_is_judged_in_parts_and_sent_whole(judge_url: str) -> None:
    gw, secret = gateway_for(judge_url, "ok", say=f"{FILLER} {FILLER}", judge_context=1024)
    try:
        gw.serve([], [])
        body = {"model": "chat", "messages": [{"role": "user", "content": "x"}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
        assert r.status_code == 200
        assert r.json()["choices"][0]["message"]["content"] == f"{FILLER} {FILLER}"
    finally:
        gw.close()
        records.RECORDER.stop()


def test_the_middle_of_a_request_too_long_for_its_judge_is_judged(judge_url: str) -> None:
    """A request read by its start and end alone let the marker in its middle through to
    the engine, and its answer to the client."""
    gw, secret = gateway_for(judge_url, "ok", say="the answer", judge_context=1024,
                             directions=("requests",))  # fmt: skip
    try:
        gw.serve([], [])
        body = {"model": "chat", "messages": [{"role": "user", "content": LONG}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["code"] == "content_filter"
        assert "the answer" not in r.text
        # A long request that is safe throughout is judged in parts and answered.
        body = {"model": "chat", "messages": [{"role": "user", "content": f"{FILLER} {FILLER}"}]}
        r = httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60,
                       headers={"Authorization": f"Bearer {secret}"})  # fmt: skip
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "the answer"
    finally:
        gw.close()
        records.RECORDER.stop()
