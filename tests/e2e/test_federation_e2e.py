"""Federation through a real ``manage.py serve`` process: a peer added with
``federation add``; the process's reconcile tick reads the peer's ``/v1/models`` and its
models appear as ``PEER/MODEL``; the ``openai`` client's requests through it reach the peer
(a gateway in front of its engine) renamed, with the peer's key, and name the peer; the
peer refusing its key: its models leave the list and a request is refused at once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog.models import ServedModel
from gateway import peers
from gateway import services as key_services
from gateway.models import Peer
from gateway.path.table import Key, digest
from tests.e2e.conftest import ControlPlane, wait_for
from tests.gateway.harness import Harness, model

pytestmark = pytest.mark.e2e

PEER_KEY = "llmgw-ck-the-peers-own-key-for-west"


@pytest.fixture
def peer() -> Iterator[tuple[Harness, Any]]:
    h = Harness()
    engine = h.engine("east")
    h.keys = {digest(PEER_KEY): Key(7, "from-west", "", (), None)}
    h.serve([model("chat")], [(1, "chat", engine)])
    yield h, engine
    h.close()


def test_a_peer_added_its_models_served_through_this_cluster_and_refused_when_it_is_down(
    transactional_db: Any, tmp_path: Path, settings: Any, peer: Any
) -> None:
    h, engine = peer
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "east").write_text(PEER_KEY + "\n")
    listed = h.url.split("//", 1)[1]
    settings.LLMGW_SECRETS_DIR = str(secrets)
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [listed]
    cp = ControlPlane(tmp_path, extra={
        "LLMGW_SECRETS_DIR": str(secrets), "LLMGW_EXTERNAL_HTTP_HOSTS": listed,
        "LLMGW_FEDERATION_REFRESH": "1",
    })  # fmt: skip
    cp.start()
    try:
        peers.add_peer("east", h.url, "east")
        wait_for(lambda: ServedModel.objects.filter(name="east/chat").exists(), 30,
                 "the peer's model in the catalog")  # fmt: skip
        _, key = key_services.create_key("app", models=["east/chat"])
        client = openai.OpenAI(base_url=cp.url + "/v1", api_key=key, max_retries=0, timeout=30)
        wait_for(lambda: [m.id for m in client.models.list()] == ["east/chat"], 30, "listed")
        raw = client.chat.completions.with_raw_response.create(
            model="east/chat", messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.headers["x-llmgw-peer"] == "east"
        assert raw.parse().choices[0].message.content == "east0 east1 east2 east3 east4"
        assert engine.bodies[-1]["model"] == "chat"
        # The peer no longer takes the key: tripped at its next read, its model unlisted.
        h.keys = {}
        h.refresh()
        wait_for(lambda: Peer.objects.get().state == "tripped", 30, "the peer tripped")
        wait_for(lambda: [m.id for m in client.models.list()] == [], 10, "unlisted")
        before = engine.requests
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(
                model="east/chat", messages=[{"role": "user", "content": "hi"}]
            )
        assert (
            caught.value.status_code == 503 and "federated cluster 'east'" in caught.value.message
        )
        assert engine.requests == before
    finally:
        cp.stop()
