"""A request for PEER/MODEL through this gateway goes to the peer (a gateway of its own,
in front of its engine) with the model renamed to the peer's name and the peer's key,
whole and streamed, through the ``openai`` client; the answer names the peer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from gateway.path import federation
from gateway.path.table import Key, digest
from tests.gateway.harness import KEY, Harness, model

PEER_KEY = "llmgw-ck-the-peers-own-key-for-us"


@pytest.fixture
def two(tmp_path: Path, settings: Any) -> Iterator[tuple[Harness, Harness, Any]]:
    peer = Harness()
    engine = peer.engine("east")
    peer.keys = {digest(PEER_KEY): Key(7, "from-west", "", (), None)}
    peer.serve([model("chat")], [(1, "chat", engine)])
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "east").write_text(PEER_KEY + "\n")
    settings.LLMGW_SECRETS_DIR = str(secrets)
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [peer.url.split("//", 1)[1]]
    here = Harness()
    here.keys = {digest(KEY): Key(1, "app", "team:t", ("east/chat",), None)}
    here.serve([federation.peer_model("east", peer.url, "east", "chat")], [])
    yield here, peer, engine
    here.close()
    peer.close()


def test_a_peer_model_is_answered_by_the_peer_renamed_with_its_key(two: Any) -> None:
    here, _, engine = two
    client = openai.OpenAI(base_url=here.url + "/v1", api_key=KEY, max_retries=0, timeout=20)
    listed = [m.id for m in client.models.list()]
    assert listed == ["east/chat"]
    raw = client.chat.completions.with_raw_response.create(
        model="east/chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.headers["x-llmgw-peer"] == "east"
    assert raw.parse().choices[0].message.content == "east0 east1 east2 east3 east4"
    # The peer's engine saw the peer's own name; the peer's gateway took the peer's key.
    assert engine.bodies[-1]["model"] == "chat"
    with client.chat.completions.with_streaming_response.create(
        model="east/chat", messages=[{"role": "user", "content": "hi"}], stream=True
    ) as streamed:
        assert streamed.headers["x-llmgw-peer"] == "east"
        text = "".join(c.choices[0].delta.content or "" for c in streamed.parse() if c.choices)
    assert text.split() == [f"east{i}" for i in range(5)]
    assert engine.requests == 2


def test_a_local_answer_names_no_peer(two: Any) -> None:
    here, peer, _ = two
    client = openai.OpenAI(base_url=peer.url + "/v1", api_key=PEER_KEY, max_retries=0, timeout=20)
    raw = client.chat.completions.with_raw_response.create(
        model="chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert "x-llmgw-peer" not in raw.headers


def test_a_peer_that_is_down_leaves_the_list_and_is_refused_at_once(two: Any) -> None:
    here, _, engine = two
    here.down = {"east": "its /v1/models answered 502"}
    here.refresh()
    client = openai.OpenAI(base_url=here.url + "/v1", api_key=KEY, max_retries=2, timeout=20)
    assert [m.id for m in client.models.list()] == []
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(
            model="east/chat", messages=[{"role": "user", "content": "hi"}]
        )
    error = caught.value
    assert error.status_code == 503 and error.response.headers["x-should-retry"] == "false"
    assert "federated cluster 'east', which is down (its /v1/models answered 502)" in error.message
    assert engine.requests == 0  # nothing sent, and the client did not retry
    # Back up: listed and answered again.
    here.down = {}
    here.refresh()
    assert [m.id for m in client.models.list()] == ["east/chat"]
    client.chat.completions.create(model="east/chat", messages=[{"role": "user", "content": "hi"}])
    assert engine.requests == 1


def test_a_down_peer_models_request_goes_to_its_fallback(two: Any) -> None:
    here, _, engine = two
    local = here.engine("local")
    peer_chat = federation.peer_model("east", two[1].url, "east", "chat")
    peer_chat.fallbacks = ["chat"]
    here.keys = {digest(KEY): Key(1, "app", "team:t", ("east/chat", "chat"), None)}
    here.down = {"east": "no answer within 5 s"}
    here.serve([peer_chat, model("chat")], [(1, "chat", local)])
    client = openai.OpenAI(base_url=here.url + "/v1", api_key=KEY, max_retries=0, timeout=20)
    answer = client.chat.completions.with_raw_response.create(
        model="east/chat", messages=[{"role": "user", "content": "hi"}]
    )
    assert "x-llmgw-peer" not in answer.headers
    assert answer.parse().choices[0].message.content.startswith("local0")
    assert engine.requests == 0 and local.requests == 1
