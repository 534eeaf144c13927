"""What may cross between federated clusters, through two gateways and the ``openai``
client: a peer's key (owner ``peer:NAME``) never lists nor reaches a ``residency: local``
model, nor a model its cluster learned from another peer, on any hop; a request that came
through a federating gateway (``x-llmgw-via``) is held to the same whatever its key, so
nothing is sent on from one peer to another. And overflow: a low band held back by
admission is answered by the model's overflow (a peer's model) instead of a 429, counted
on the Traffic page."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from catalog import spec
from gateway import live
from gateway.models import TrafficPoint
from gateway.path import federation
from gateway.path.admission import Admission, Counts
from gateway.path.table import Key, digest
from gateway.records import history
from gateway.records.observe import Fanout
from gateway.records.traffic import SPAN, Traffic
from tests.gateway.harness import KEY, Harness, model

PEER_KEY = "llmgw-ck-the-peers-own-key-for-us"
LOW = "llmgw-ck-a-low-band-key-here"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def east(tmp_path: Path, settings: Any) -> Iterator[tuple[Harness, dict[str, Any]]]:
    """The peer: a shared model, a residency: local one, and one it learned from its own
    peer (far), each on an engine of its own; the key it gave us is a peer's."""
    h = Harness()
    engines = {n: h.engine(n) for n in ("chat", "secret", "far")}
    far = federation.peer_model("far", engines["far"].url, "", "x")
    h.keys = {digest(PEER_KEY): Key(7, "west", "peer:west", (), None, peer=True)}
    h.serve(
        [model("chat"), model("secret", residency="local"), far],
        [(1, "chat", engines["chat"]), (2, "secret", engines["secret"])],
    )
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "east").write_text(PEER_KEY + "\n")
    settings.LLMGW_SECRETS_DIR = str(secrets)
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = [h.url.split("//", 1)[1], engines["far"].url[7:]]
    yield h, engines
    h.close()


def client(h: Harness, secret: str, retries: int = 0) -> openai.OpenAI:
    return openai.OpenAI(base_url=h.url + "/v1", api_key=secret, max_retries=retries, timeout=20)


def test_a_peers_key_sees_and_reaches_neither_a_local_model_nor_a_peers(east: Any) -> None:
    h, engines = east
    c = client(h, PEER_KEY)
    assert [m.id for m in c.models.list()] == ["chat"]
    for name in ("secret", "far/x"):
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve(name)
        with pytest.raises(openai.NotFoundError) as caught:
            c.chat.completions.create(model=name, messages=HI)
        assert caught.value.body["code"] == "model_not_found"  # type: ignore[index]
    assert c.chat.completions.create(model="chat", messages=HI).choices[0].message.content
    assert (engines["secret"].requests, engines["far"].requests) == (0, 0)
    # Even a peer's key that lists them by name.
    h.keys = {digest(PEER_KEY): Key(7, "west", "peer:west", ("chat", "secret", "far/x"), None,
                                    peer=True)}  # fmt: skip
    h.refresh()
    assert [m.id for m in c.models.list()] == ["chat"]
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="secret", messages=HI)


def test_a_request_through_a_federating_gateway_is_not_sent_on_to_another_peer(
    east: Any,
) -> None:
    h, engines = east
    # The key the peer gave us is an ordinary one, listing all three: asked directly, each
    # answers; asked through our gateway (which says x-llmgw-via), none but the shared.
    h.keys = {digest(PEER_KEY): Key(7, "west", "team:w", ("chat", "secret", "far/x"), None)}
    h.refresh()
    direct = client(h, PEER_KEY)
    assert sorted(m.id for m in direct.models.list()) == ["chat", "far/x", "secret"]
    direct.chat.completions.create(model="far/x", messages=HI)
    assert engines["far"].requests == 1
    here = Harness()
    try:
        here.keys = {digest(KEY): Key(1, "app", "team:t", ("east/chat", "east/far/x",
                                                           "east/secret"), None)}  # fmt: skip
        here.serve([federation.peer_model("east", h.url, "east", n)
                    for n in ("chat", "far/x", "secret")], [])  # fmt: skip
        c = client(here, KEY)
        answer = c.chat.completions.with_raw_response.create(model="east/chat", messages=HI)
        assert answer.headers["x-llmgw-peer"] == "east"
        for name in ("east/far/x", "east/secret"):
            with pytest.raises(openai.NotFoundError):
                c.chat.completions.create(model=name, messages=HI)
        assert (engines["far"].requests, engines["secret"].requests) == (1, 0)
    finally:
        here.close()


def test_a_peers_request_is_not_sent_to_a_peer_by_a_fallback(east: Any) -> None:
    h, engines = east
    chat = model("chat", fallbacks=["far/x"])
    h.keys = {
        digest(PEER_KEY): Key(7, "west", "peer:west", ("chat", "far/x"), None, peer=True),
        digest(KEY): Key(1, "app", "team:t", ("chat", "far/x"), None),
    }
    engines["chat"].behaviour = "503"
    h.serve([chat, model("secret", residency="local"), h.models[2]],
            [(1, "chat", engines["chat"])])  # fmt: skip
    with pytest.raises(openai.APIStatusError) as caught:
        client(h, PEER_KEY).chat.completions.create(model="chat", messages=HI)
    assert caught.value.status_code in (502, 503) and engines["far"].requests == 0
    # The same fallback for a key of this cluster's own.
    answer = client(h, KEY).chat.completions.create(model="chat", messages=HI)
    assert answer.choices[0].message.content.startswith("far0")
    assert engines["far"].requests == 1


@pytest.mark.django_db
def test_a_low_band_held_back_is_answered_by_the_overflow_none_429(
    east: Any, client_for: Any, viewer: Any
) -> None:
    peer, engines = east
    here = Harness()
    try:
        traffic = Traffic(publish=lambda message: None)
        recorder = history.HistoryRecorder()
        here.gateway.observer = Fanout(traffic, recorder)
        here.gateway.admission = Admission(window=10.0, queue=0.2, counts=Counts())
        # The local replica takes 600 ms to answer and its slo is 300 ms: past it after
        # one answer, and the low band held back from then on.
        local = here.engine("local", delay=0.6)
        chat = model("chat", slo=spec.SLO(ttft_p99=300_000_000), overflow="east/chat")
        here.keys = {
            digest(KEY): Key(1, "app", "team:t", (), None),
            digest(LOW): Key(2, "batch", "team:t", ("chat", "east/chat"), None, priority="low"),
        }
        here.serve([chat, federation.peer_model("east", peer.url, "east", "chat")],
                   [(1, "chat", local)])  # fmt: skip
        assert client(here, KEY).chat.completions.create(model="chat", messages=HI)
        # Twice what the one replica answers within its slo, at once, by the low key.
        got: list[Any] = []

        def ask() -> None:
            try:
                got.append(client(here, LOW).chat.completions.with_raw_response.create(
                    model="chat", messages=HI))  # fmt: skip
            except openai.APIStatusError as error:
                got.append(error)

        threads = [threading.Thread(target=ask) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert len(got) == 8
        refused = [g for g in got if isinstance(g, Exception)]
        assert refused == []  # none 429
        peers = [g for g in got if g.headers.get("x-llmgw-peer") == "east"]
        # Held back all but the odd one the allowance lets in (one a second while nothing
        # of the model is in flight here: admission's additive increase).
        assert len(peers) >= 6 and engines["chat"].requests == len(peers)
        assert local.requests == 1 + 8 - len(peers)
        assert all(g.parse().choices[0].message.content.startswith("chat0") for g in peers)
        assert here.gateway.observer.overflows == {("chat", "east/chat"): len(peers)}
        # Each second's item says how many went to the overflow, and the Traffic page
        # shows those of its span (the last SPAN seconds, here ending with the last one).
        items = traffic.take(int(time.time()) + 1)
        went = {i["second"]: i["overflowed"]["east/chat"] for i in items if "overflowed" in i}
        assert sum(went.values()) == len(peers)
        last = max(went)
        shown = sum(n for second, n in went.items() if second > last - SPAN)
        live.WINDOW.items.clear()
        live.WINDOW.add(items, now=last + 1)
        live._rendered = None
        html = live.render_traffic(last + 1.5)
        assert f'data-overflowed="east/chat" data-requests="{shown}"' in html
        assert f">{shown} to <a" in html
        # And its records: the minute rows of the model asked for, each shaded on its chart.
        history.write(recorder.pending())
        minutes = list(TrafficPoint.objects.filter(model="chat").values_list("overflowed",
                                                                             flat=True))  # fmt: skip
        assert sum(minutes) == len(peers)
        page = client_for(viewer).get("/gateway/traffic/?model=chat&span=hour").content.decode()
        assert all(f"{n} sent to its overflow" in page for n in minutes if n)
    finally:
        here.close()


@pytest.mark.django_db
def test_a_key_owned_peer_name_is_a_peers_and_a_wrong_owner_is_refused() -> None:
    from django.core.management import CommandError, call_command

    from gateway import services as key_services
    from gateway.records.state import load_table

    _, secret = key_services.create_key("west", owner="peer:west")
    _, ours = key_services.create_key("app", owner="team:t")
    keys = load_table().keys
    assert keys[digest(secret)].peer and not keys[digest(ours)].peer
    with pytest.raises(CommandError, match="peer:NAME"):
        call_command("gateway", "key", "create", "bad", "--owner", "peers:west")
