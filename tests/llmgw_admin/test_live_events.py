"""The one catalogue of live events (``cluster.events.EVENTS``) and what reads it.

The publisher, the embedded relay's parser (tests/cluster/test_relay.py reads back one
message of every event), the hub and the consumer all take an event's topic, type, group
and keys from the catalogue; what is left to each event of its own is its handler in the
consumer, held here. The pushes themselves: tests/llmgw_admin/test_live_ws.py.
"""

from __future__ import annotations

import pytest

from cluster import events
from llmgw_admin.consumer import LiveConsumer


def test_each_topic_type_and_group_is_one_events() -> None:
    for field in ("topic", "type", "group"):
        values = [getattr(e, field) for e in events.EVENTS]
        assert len(values) == len(set(values)), field


def test_every_event_has_its_handler_in_the_consumer_and_every_handler_its_event() -> None:
    handlers = {name for name in dir(LiveConsumer) if name.endswith("_changed")}
    assert handlers == {e.type.replace(".", "_") for e in events.EVENTS}


def test_a_message_carries_its_type_id_and_sorted_keys_and_reads_back() -> None:
    nodes = events.BY_TOPIC["nodes"]
    message = nodes.message("e1", {3, 1})
    assert message == {"type": "cluster.nodes_changed", "id": "e1", "pks": [1, 3]}
    assert events.keys_of(message) == [1, 3]


def test_marking_a_topic_the_catalogue_lacks_is_refused_naming_the_events() -> None:
    with pytest.raises(TypeError) as caught:
        events.changed(nodez=[1])
    assert str(caught.value) == (
        "changed(): no live event 'nodez'; the events: ['evals', 'judges', 'models', 'nodes', 'traffic']"
    )
