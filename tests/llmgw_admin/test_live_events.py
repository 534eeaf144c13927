"""The live events each app registers in its ``ready()``, the bus they go through
(``llmgw_core.events``), and what reads them.

The publisher, the embedded relay's parser (tests/cluster/test_relay.py reads back one
message of every event), the hub and the consumer all take an event's topic, type, group
and keys from what the apps registered; what is left to each event of its own is its
handler in the consumer, held here. The pushes themselves: tests/llmgw_admin/test_live_ws.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from django.apps import apps

from llmgw_admin.consumer import LiveConsumer
from llmgw_core import events

BUS = Path(events.__file__)


def test_each_topic_type_and_group_is_one_events() -> None:
    for field in ("topic", "type", "group"):
        values = [getattr(e, field) for e in events.EVENTS]
        assert len(values) == len(set(values)), field


def test_each_event_is_named_for_the_app_that_registers_it() -> None:
    by_app = {e.type.split(".")[0] for e in events.EVENTS}
    assert by_app <= {a.label for a in apps.get_app_configs()}
    assert {e.topic for e in events.EVENTS} >= {"nodes", "models", "judges", "evals", "traffic"}
    for e in events.EVENTS:
        app = apps.get_app_config(e.type.split(".")[0])
        source = Path(app.path, "apps.py").read_text()
        assert repr(e.type) in source.replace('"', "'"), (
            f"{e.type} is not declared in {app.label}/apps.py"
        )


def test_the_bus_names_no_event_of_any_app() -> None:
    names = {v for e in events.EVENTS for v in (e.topic, e.type, e.group)}
    names |= {d.source for d in events.DERIVATIONS}
    strings = {
        node.value
        for node in ast.walk(ast.parse(BUS.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert not names & strings


def test_every_event_has_its_handler_in_the_consumer_and_every_handler_its_event() -> None:
    handlers = {name for name in dir(LiveConsumer) if name.endswith("_changed")}
    assert handlers == {e.type.replace(".", "_") for e in events.EVENTS}


def test_a_message_carries_its_type_id_and_sorted_keys_and_reads_back() -> None:
    nodes = events.BY_TOPIC["nodes"]
    message = nodes.message("e1", {3, 1})
    assert message == {"type": "cluster.nodes_changed", "id": "e1", "pks": [1, 3]}
    assert events.keys_of(message) == [1, 3]


def test_marking_a_topic_no_app_registered_is_refused_naming_the_events() -> None:
    with pytest.raises(TypeError) as caught:
        events.changed(nodez=[1])
    assert str(caught.value) == (
        "changed(): no live event 'nodez'; the events: "
        "['evals', 'judges', 'models', 'nodes', 'peers', 'replicas', 'traffic']"
    )
    with pytest.raises(TypeError):
        events.changed(refresh=["nodez"])


def test_registering_an_event_again_is_a_no_op_and_another_on_a_taken_name_is_refused() -> None:
    before = list(events.EVENTS)
    events.register(events.BY_TOPIC["nodes"])
    assert before == events.EVENTS
    taken = events.Event("nodes", "cluster.other_changed", "cluster.other", "pks", int, "")
    with pytest.raises(ValueError, match="live event 'nodes': its topic 'nodes' is taken"):
        events.register(taken)
    clash = events.Event("other", "cluster.other_changed", "cluster.nodes", "pks", int, "")
    with pytest.raises(ValueError, match="its group 'cluster.nodes' is taken"):
        events.register(clash)
    assert before == events.EVENTS
