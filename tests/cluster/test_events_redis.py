"""A write's live push while Redis is away or hung: the write finishes and is recorded.

The channel layer is the production one (channels-redis) on the local Redis behind a
FaultProxy the test cuts; the write goes through the API as an operator's script sends it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from channels.layers import channel_layers
from django.db import connection

from cluster.models import ClusterAction, Node
from llmgw_core import events
from tests.cluster.helpers import join_node
from tests.faultproxy import FaultProxy
from tests.redisserver import url as redis_url

pytestmark = pytest.mark.django_db(transaction=True)

URL = redis_url(15)
TIMEOUT_MS = 200
# Generous: a loaded 2-core machine adds scheduling delay, never several seconds.
BOUND = 5.0


@pytest.fixture
def proxy(settings: Any) -> Iterator[FaultProxy]:
    parts = urlsplit(URL)
    p = FaultProxy((parts.hostname or "127.0.0.1", parts.port or 6379)).start()
    settings.LLMGW_REDIS_TIMEOUT_MS = TIMEOUT_MS
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {
                "hosts": [f"redis://{p.address}{parts.path}"],
                "prefix": f"llmgw-test-{uuid.uuid4().hex[:8]}",
            },
        }
    }
    channel_layers.backends.clear()
    getattr(events, "_outage", None) and events._outage.__init__()
    yield p
    p.stop()
    channel_layers.backends.clear()
    getattr(events, "_outage", None) and events._outage.__init__()


def _post(api: Any, path: str) -> tuple[int | None, float]:
    """POST in a thread, waited for up to 30 s: a write that hangs is seen, not waited on."""
    result: list[Any] = [None, 0.0]

    def run() -> None:
        start = time.monotonic()
        try:
            result[0] = api.post(path).status_code
        finally:
            result[1] = time.monotonic() - start
            connection.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), f"POST {path} still waiting after 30 s"
    return result[0], result[1]


@pytest.mark.parametrize("fault", ["refuse", "hang"])
def test_a_cordon_through_the_api_finishes_and_is_recorded_while_redis_is_cut(
    proxy: FaultProxy, fault: str, api_for: Any, operator: Any, caplog: pytest.LogCaptureFixture
) -> None:
    join_node("a")
    join_node("b")
    api = api_for(operator)
    assert _post(api, "/api/v1/cluster/nodes/b/uncordon/")[0] == 200  # published through Redis
    getattr(proxy, fault)()
    status, took = _post(api, "/api/v1/cluster/nodes/a/cordon/")
    assert status == 200 and took < BOUND, f"{fault}: the cordon took {took:.2f} s"
    assert Node.objects.get(name="a").cordoned
    assert ClusterAction.objects.filter(action="cordon", target="node a").exists()
    # The next writes do not wait on Redis again: their pushes are dropped at once.
    status, took = _post(api, "/api/v1/cluster/nodes/a/uncordon/")
    assert status == 200 and took < BOUND
    assert ClusterAction.objects.filter(action="uncordon", target="node a").exists()
    said = [r.getMessage() for r in caplog.records if r.name == "llmgw_core.events"]
    assert len(said) == 1 and "live events are dropped" in said[0], said
    assert not any(r.exc_info for r in caplog.records if r.name == "llmgw_core.events")


def test_a_push_as_the_interpreter_shuts_down_is_dropped_without_a_traceback(
    proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    """A gateway's traffic thread publishing once a second while SIGTERM ends the process:
    asgiref's executor then refuses new work ("cannot schedule new futures after
    interpreter shutdown"), which was logged with its traceback."""
    import concurrent.futures.thread as pool

    done = threading.Event()

    def publish() -> None:
        events.send("gateway.traffic", {"type": "gateway.traffic_changed", "id": "x",
                                        "models": []})  # fmt: skip
        done.set()

    pool._shutdown = True  # what the interpreter's exit sets before daemon threads stop
    try:
        t = threading.Thread(target=publish, daemon=True)
        t.start()
        t.join(10)
    finally:
        pool._shutdown = False
    assert done.is_set()
    logged = [r for r in caplog.records if r.name == "llmgw_core.events" and r.levelno >= 30]
    assert logged == [], [r.getMessage() for r in logged]
