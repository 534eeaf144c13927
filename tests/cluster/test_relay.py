"""Live events from other processes in the embedded mode (cluster.relay).

The web process's side (``live.sock`` bound by ``manage.py serve``, a console hearing a
command's change) is proved against the real process in tests/e2e/test_live_console.py.
Here: what a datagram may hold, and that a process with no console sends its committed
changes to the socket, to a real Unix socket bound by the test.
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster import relay
from llmgw_core import events


def good() -> list[tuple[str, dict[str, Any]]]:
    """One message of each event of the catalogue, as the publisher makes it."""
    keys = {int: [1, 7], str: ["m", ""], dict: [{"model": "m", "requests": 2}]}
    return [(e.group, e.message("a1", keys[e.item])) for e in events.EVENTS]


@pytest.mark.parametrize(("group", "message"), good())
def test_every_event_the_publisher_makes_is_read_back(group: str, message: dict) -> None:
    assert relay.parse(relay.encode(group, message)) == (group, message)


@given(
    group_and_type=st.sampled_from(sorted((g, t) for t, g in events.GROUP_OF_TYPE.items())),
    pks=st.lists(st.integers(min_value=1, max_value=2**62), max_size=50),
    names=st.lists(st.text(max_size=60), max_size=50),
)
def test_any_event_of_the_known_kinds_survives_the_trip(
    group_and_type: tuple[str, str], pks: list[int], names: list[str]
) -> None:
    group, kind = group_and_type
    keys = events.BY_TYPE[kind].keys
    item = events.BY_TYPE[kind].item
    values = {int: pks, str: names, dict: [{"model": n, "requests": 1} for n in names]}[item]
    message = {"type": kind, "id": "e" * 32, keys: values}
    assert relay.parse(relay.encode(group, message)) == (group, message)


BAD = [
    (b"\xff\xfe", "not JSON"),
    (b"{", "not JSON"),
    (b"[" * 5000, "nested too deeply"),
    (b"[]", '"group" and "message" only'),
    (b'{"group": "cluster.nodes"}', '"group" and "message" only'),
    (b'{"group": "x", "message": {}, "more": 1}', '"group" and "message" only'),
    (b'{"group": "cluster.secrets", "message": {}}', "unknown group 'cluster.secrets'"),
    (b'{"group": "cluster.nodes", "message": []}', "message: expected an object"),
    (
        b'{"group": "cluster.nodes", "message": {"type": "guard.judges_changed", "id": "a", '
        b'"names": []}}',
        "'guard.judges_changed' is not an event of cluster.nodes",
    ),
    (
        b'{"group": "cluster.nodes", "message": {"type": "websocket.close", "id": "a"}}',
        "'websocket.close' is not an event of cluster.nodes",
    ),
    (
        b'{"group": "cluster.nodes", "message": {"type": "cluster.nodes_changed", "id": "a", '
        b'"names": ["n"]}}',
        "expected type, id and pks only",
    ),
    (
        b'{"group": "cluster.nodes", "message": {"type": "cluster.nodes_changed", "id": "a", '
        b'"pks": [1], "html": "<script>"}}',
        "expected type, id and pks only",
    ),
    (
        b'{"group": "cluster.nodes", "message": {"type": "cluster.nodes_changed", "id": 5, '
        b'"pks": [1]}}',
        "message.id: expected a string",
    ),
    (
        b'{"group": "cluster.nodes", "message": {"type": "cluster.nodes_changed", "id": "", '
        b'"pks": [1]}}',
        "message.id: expected a string",
    ),
    (
        b'{"group": "cluster.nodes", "message": {"type": "cluster.nodes_changed", "id": "a", '
        b'"pks": [true]}}',
        "message.pks: expected a list of int",
    ),
    (
        b'{"group": "cluster.models", "message": {"type": "cluster.models_changed", "id": "a", '
        b'"names": "m"}}',
        "message.names: expected a list of str",
    ),
]


@pytest.mark.parametrize(("data", "says"), BAD)
def test_anything_else_is_refused_saying_what(data: bytes, says: str) -> None:
    with pytest.raises(relay.BadEvent) as caught:
        relay.parse(data)
    assert says in str(caught.value)


@given(st.binary(max_size=300))
def test_no_datagram_raises_anything_but_a_refusal(data: bytes) -> None:
    try:
        group, message = relay.parse(data)
    except relay.BadEvent:
        return
    assert events.GROUP_OF_TYPE[message["type"]] == group


def test_with_no_web_process_listening_a_send_reaches_nobody(tmp_path: Path) -> None:
    assert not (tmp_path / "live.sock").exists()
    assert relay.send(*good()[0], data_dir=tmp_path) is False


def test_a_data_folder_too_deep_for_a_socket_is_not_listened_on(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    assert relay.listen(deep) is None
    assert not relay.listening()
    assert relay.send(*good()[0], data_dir=deep) is False


@pytest.fixture
def web_socket(tmp_path: Path, settings: Any) -> Any:
    """A Unix datagram socket where the web process would listen, in this test's folder."""
    from channels.layers import channel_layers

    settings.DATA_DIR = tmp_path
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    channel_layers.backends.clear()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "live.sock"))
    sock.settimeout(5)
    yield sock
    sock.close()
    channel_layers.backends.clear()


@pytest.mark.django_db(transaction=True)
def test_a_process_with_no_console_hands_its_committed_change_to_the_web_process(
    web_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django.db import transaction

    from cluster import services
    from tests.cluster.helpers import join_node

    monkeypatch.setattr(events, "_home_loop", None)  # no console ever connected here
    node, _ = join_node("relay-1")
    while True:  # what joining published
        web_socket.settimeout(0.5)
        try:
            web_socket.recv(relay.MAX_DATAGRAM)
        except TimeoutError:
            break
    web_socket.settimeout(5)

    with transaction.atomic():
        services.set_cordon(node, True)
        # Nothing leaves before the commit.
        web_socket.settimeout(0.2)
        with pytest.raises(TimeoutError):
            web_socket.recv(relay.MAX_DATAGRAM)
        web_socket.settimeout(5)
    group, message = relay.parse(web_socket.recv(relay.MAX_DATAGRAM))
    assert group == events.BY_TOPIC["nodes"].group
    assert message["pks"] == [node.pk]

    # A rolled-back change sends nothing.
    try:
        with transaction.atomic():
            services.set_cordon(node, False)
            raise RuntimeError("undo")
    except RuntimeError:
        pass
    web_socket.settimeout(0.5)
    with pytest.raises(TimeoutError):
        web_socket.recv(relay.MAX_DATAGRAM)


@pytest.mark.django_db(transaction=True)
def test_a_process_with_no_loop_sends_its_wake_up_to_the_web_process(
    web_socket: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cluster import wake
    from tests.catalog.samples import gpu_model, store

    monkeypatch.setattr(wake, "_looping", False)
    monkeypatch.setattr(events, "_home_loop", None)
    store(gpu_model("chat"))
    got = []
    web_socket.settimeout(0.5)
    with contextlib.suppress(TimeoutError):
        while True:
            got.append(web_socket.recv(relay.MAX_DATAGRAM))
    assert relay.WAKE in got
    with pytest.raises(relay.BadEvent):
        relay.parse(relay.WAKE)  # not an event: the listener takes it before parsing
