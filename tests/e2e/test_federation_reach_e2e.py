"""What may cross, through a real ``manage.py serve`` process (this cluster, "east") and a
gateway that federates it ("west"), with the ``openai`` client: a key made with owner
``peer:west`` lists and reaches neither east's ``residency: local`` model nor one east
learned from its own peer; an ordinary key of east's reaches all three directly, but not
through west's gateway, whose requests and list reads say ``x-llmgw-via``: nothing is
passed on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog import services as catalog
from catalog import spec
from catalog.choices import Surface
from gateway import peers
from gateway import services as key_services
from gateway.models import Peer
from gateway.path import federation
from gateway.path.table import Key, digest
from tests.e2e.conftest import ControlPlane, wait_for
from tests.gateway.harness import KEY, Engine, Harness

pytestmark = pytest.mark.e2e

HI = [{"role": "user", "content": "hi"}]
NAMES = ("shared", "secret", "far/x")


@pytest.fixture
def west() -> Iterator[tuple[Harness, dict[str, Engine]]]:
    h = Harness()
    engines = {n: h.engine(n.replace("/", "-")) for n in NAMES}
    yield h, engines
    h.close()


def external(name: str, engine: Engine, **kw: Any) -> spec.Model:
    return spec.Model(name=name, source=f"https://example.com/{name}",
                      external=spec.External(url=engine.url, model=name, **kw.pop("ext", {})),
                      **kw)  # fmt: skip


def test_a_peers_key_and_a_request_through_a_peer_reach_nothing_local_nor_onward(
    transactional_db: Any, tmp_path: Path, settings: Any, west: Any
) -> None:
    h, engines = west
    hosts = [e.url.split("//", 1)[1] for e in engines.values()]
    cp = ControlPlane(tmp_path)
    hosts.append(cp.url.split("//", 1)[1])
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    settings.LLMGW_SECRETS_DIR = str(secrets)
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = hosts
    cp.extra = {"LLMGW_SECRETS_DIR": str(secrets), "LLMGW_EXTERNAL_HTTP_HOSTS": ",".join(hosts)}
    actor = catalog.Actor(user=None, surface=Surface.CLI, name="test")
    catalog.save_model(external("shared", engines["shared"]), actor)
    catalog.save_model(external("secret", engines["secret"], residency="local"), actor)
    catalog.save_model(external("far/x", engines["far/x"], ext={"peer": "far"}), actor)
    _, peer_key = key_services.create_key("west", owner="peer:west", models=list(NAMES))
    _, plain_key = key_services.create_key("partner", owner="team:p", models=list(NAMES))
    cp.start()
    try:
        as_peer = openai.OpenAI(base_url=cp.url + "/v1", api_key=peer_key, max_retries=0,
                                timeout=30)  # fmt: skip
        wait_for(lambda: [m.id for m in as_peer.models.list()] == ["shared"], 30, "listed")
        for name in ("secret", "far/x"):
            with pytest.raises(openai.NotFoundError):
                as_peer.chat.completions.create(model=name, messages=HI)
        assert as_peer.chat.completions.create(model="shared", messages=HI).choices
        assert [engines[n].requests for n in NAMES] == [1, 0, 0]
        # An ordinary key of east's: all three, asked directly.
        plain = openai.OpenAI(base_url=cp.url + "/v1", api_key=plain_key, max_retries=0,
                              timeout=30)  # fmt: skip
        assert sorted(m.id for m in plain.models.list()) == sorted(NAMES)
        # The same key, as west's federation key: west's refresh learns only the shared,
        # and through west's gateway only the shared is answered.
        (secrets / "east").write_text(plain_key + "\n")
        assert peers.read_models(Peer(name="east", url=cp.url, api_key_file="east")).models == [
            "shared"
        ]
        h.keys = {digest(KEY): Key(1, "app", "team:t", tuple(f"east/{n}" for n in NAMES), None)}
        h.serve([federation.peer_model("east", cp.url, "east", n) for n in NAMES], [])
        through = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=30)
        answer = through.chat.completions.with_raw_response.create(model="east/shared",
                                                                   messages=HI)  # fmt: skip
        assert answer.headers["x-llmgw-peer"] == "east"
        for name in ("east/secret", "east/far/x"):
            with pytest.raises(openai.NotFoundError):
                through.chat.completions.create(model=name, messages=HI)
        assert [engines[n].requests for n in NAMES] == [2, 0, 0]
    finally:
        cp.stop()
