"""The live console's websocket through the real ASGI application and a real Redis layer.

Each test gets its own channel-layer prefix on the local Redis, so runs don't hear each
other. Writes go through the services in committed transactions, as they do in use.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.layers import channel_layers
from channels.testing import WebsocketCommunicator
from django.db import connection, transaction
from django.test import Client

from cluster import services
from cluster.models import FacilityBudget, Node, Replica
from llmgw_admin.consumer import BEAT_TEXT
from tests.cluster.helpers import join_node
from tests.redisserver import url as redis_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

ORIGIN = (b"origin", b"http://localhost")


@pytest.fixture(autouse=True)
def redis_layer(settings: Any) -> Any:
    url = redis_url(0)
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [url], "prefix": f"llmgw-test-{uuid.uuid4().hex[:8]}"},
        }
    }
    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


def _app() -> Any:
    from llmgw_admin.asgi import application

    return application


def _cookie(user: Any) -> tuple[bytes, bytes]:
    c = Client()
    c.force_login(user)
    return (b"cookie", f"sessionid={c.cookies['sessionid'].value}".encode())


class Page(WebsocketCommunicator):
    """A console's socket as its page reads it: the hub's heartbeat (every 2 s, which a
    page only counts to know it is live) is not a frame the page shows."""

    async def receive_from(self, timeout: float = 1) -> Any:
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            frame = await super().receive_from(timeout=max(left, 0.01))
            if frame != BEAT_TEXT:
                return frame


async def _connect(path: str, *headers: tuple[bytes, bytes]) -> tuple[WebsocketCommunicator, bool]:
    comm = Page(_app(), path, headers=list(headers))
    connected, _ = await comm.connect(timeout=5)
    return comm, connected


async def _open(user: Any, path: str = "/ws/live/nodes,models,judges/") -> WebsocketCommunicator:
    cookie = await sync_to_async(_cookie)(user)
    comm, connected = await _connect(path, ORIGIN, cookie)
    assert connected, f"{user} could not connect to {path}"
    return comm


async def test_anonymous_is_refused() -> None:
    comm, connected = await _connect("/ws/live/nodes/", ORIGIN)
    assert not connected
    await comm.disconnect()


async def test_user_without_a_role_is_refused(outsider: Any) -> None:
    cookie = await sync_to_async(_cookie)(outsider)
    comm, connected = await _connect("/ws/live/nodes/", ORIGIN, cookie)
    assert not connected
    await comm.disconnect()


async def test_foreign_origin_is_refused(viewer: Any) -> None:
    cookie = await sync_to_async(_cookie)(viewer)
    comm, connected = await _connect("/ws/live/nodes/", (b"origin", b"http://evil.example"), cookie)
    assert not connected
    await comm.disconnect()


async def test_unknown_topic_is_refused(viewer: Any) -> None:
    cookie = await sync_to_async(_cookie)(viewer)
    comm, connected = await _connect("/ws/live/nodes,secrets/", ORIGIN, cookie)
    assert not connected
    await comm.disconnect()


async def test_snapshot_on_connect_shows_the_cluster_as_the_page_does(viewer: Any) -> None:
    node, _ = await sync_to_async(join_node)("gpu-a", ["nvidia-l4-24gb"] * 2)
    comm = await _open(viewer)
    first = await comm.receive_from(timeout=5)
    assert f'id="cluster-node-{node.pk}"' in first
    assert "2 free of 2" in first
    assert 'id="cluster-models"' in first and 'id="guard-judges"' in first
    # A viewer is shown no action.
    assert "Cordon" not in first and "Drain" not in first
    await comm.disconnect()


async def test_a_change_fans_out_to_every_console(viewer: Any, operator: Any) -> None:
    node, _ = await sync_to_async(join_node)("gpu-b", ["nvidia-l4-24gb"])
    consoles = [await _open(viewer), await _open(viewer), await _open(operator)]
    for c in consoles:
        await c.receive_from(timeout=5)  # the snapshot

    await sync_to_async(services.set_cordon)(node, True)

    for c in consoles:
        frame = await c.receive_from(timeout=5)
        assert f'id="cluster-node-{node.pk}"' in frame
        assert 'data-role="node-state">cordoned<' in frame
    for c in consoles:
        await c.disconnect()


async def test_viewers_and_operators_get_their_own_rendering(viewer: Any, operator: Any) -> None:
    node, _ = await sync_to_async(join_node)("gpu-c", ["nvidia-l4-24gb"])
    v, o = await _open(viewer), await _open(operator)
    await v.receive_from(timeout=5)
    await o.receive_from(timeout=5)
    await sync_to_async(services.set_cordon)(node, True)
    v_frame, o_frame = await v.receive_from(timeout=5), await o.receive_from(timeout=5)
    assert "Uncordon" in o_frame
    assert "Uncordon" not in v_frame and "hx-post" not in v_frame
    await v.disconnect()
    await o.disconnect()


async def test_nothing_is_sent_to_a_group_not_joined(viewer: Any) -> None:
    node, _ = await sync_to_async(join_node)("gpu-d", ["nvidia-l4-24gb"])
    judges_only = await _open(viewer, "/ws/live/judges/")
    nodes_too = await _open(viewer, "/ws/live/nodes/")
    await judges_only.receive_from(timeout=5)
    await nodes_too.receive_from(timeout=5)

    await sync_to_async(services.set_cordon)(node, True)
    assert "cordoned" in await nodes_too.receive_from(timeout=5)
    # Then a judges' event: the judges-only console's next frame is that one, not the node's.
    await sync_to_async(_probe)("qwen3guard-0.6b")
    frame = await judges_only.receive_from(timeout=5)
    assert 'id="guard-judges"' in frame and "cluster-node" not in frame
    await judges_only.disconnect()
    await nodes_too.disconnect()


async def test_a_rolled_back_write_pushes_nothing(viewer: Any) -> None:
    node, _ = await sync_to_async(join_node)("gpu-e", ["nvidia-l4-24gb"])
    comm = await _open(viewer, "/ws/live/nodes/")
    await comm.receive_from(timeout=5)

    def cordon_then_fail() -> None:
        with pytest.raises(RuntimeError), transaction.atomic():
            services.set_cordon(node, True)
            raise RuntimeError("rolled back")

    await sync_to_async(cordon_then_fail)()
    assert not (await sync_to_async(Node.objects.get)(pk=node.pk)).cordoned
    # A write that commits after it: the console's next frame is that one's, and nothing in
    # it (nor before it) says gpu-e was cordoned.
    other, _ = await sync_to_async(join_node)("gpu-e2", ["nvidia-l4-24gb"])
    frame = await comm.receive_from(timeout=5)
    assert f'id="cluster-node-{other.pk}"' in frame
    assert 'data-role="node-state">cordoned<' not in frame
    await comm.disconnect()


async def test_a_new_node_is_appended_and_a_deleted_one_removed(viewer: Any) -> None:
    comm = await _open(viewer, "/ws/live/nodes/")
    assert "No node has joined yet" in await comm.receive_from(timeout=5)

    node, _ = await sync_to_async(join_node)("gpu-new", ["nvidia-h100-80gb"])
    frame = await comm.receive_from(timeout=5)
    assert 'hx-swap-oob="beforeend:#cluster-nodes"' in frame
    assert f'id="cluster-node-{node.pk}"' in frame
    await sync_to_async(Node.objects.filter(pk=node.pk).delete)()
    # Further frames for this node (its cards arrive in the same join) replace it in place,
    # until the one that removes it.
    frame = await comm.receive_from(timeout=5)
    while f'<div id="cluster-node-{node.pk}" hx-swap-oob="delete">' not in frame:
        assert f'id="cluster-node-{node.pk}"' in frame
        assert 'hx-swap-oob="beforeend:#cluster-nodes"' not in frame  # appended once
        frame = await comm.receive_from(timeout=5)
    await comm.disconnect()


async def test_replica_states_and_unplaced_reasons_are_pushed(viewer: Any) -> None:
    from catalog.models import ServedModel

    comm = await _open(viewer, "/ws/live/models/")
    await comm.receive_from(timeout=5)

    def unplaced() -> Replica:
        served = ServedModel.objects.first()
        with transaction.atomic():
            r = Replica.objects.create(
                model=served, model_name="chat-x", reason="needs 4 free nvidia-h100-80gb"
            )
        return r

    r = await sync_to_async(unplaced)()
    frame = await comm.receive_from(timeout=5)
    assert "needs 4 free nvidia-h100-80gb" in frame
    assert 'id="cluster-unplaced"' in frame
    assert f'id="cluster-replica-{r.pk}"' in frame
    await comm.disconnect()


async def test_a_power_budget_change_refreshes_power(viewer: Any) -> None:
    await sync_to_async(join_node)("gpu-p", ["nvidia-l4-24gb"], labels={"llmgw.io/rack": "r1"})
    comm = await _open(viewer, "/ws/live/nodes/")
    await comm.receive_from(timeout=5)
    await sync_to_async(FacilityBudget.objects.create)(level="rack", name="r1", cap_watts=5000)
    frame = await comm.receive_from(timeout=5)
    assert 'id="cluster-power"' in frame and "5000 W" in frame
    await comm.disconnect()


async def test_a_judge_probe_pushes_the_judges_health(viewer: Any) -> None:
    from django.utils import timezone

    from guard.models import JudgeProbe

    comm = await _open(viewer, "/ws/live/judges/")
    await comm.receive_from(timeout=5)
    await sync_to_async(JudgeProbe.objects.create)(
        judge="qwen3guard-0.6b", at=timezone.now(), ok=False, error="connection refused"
    )
    frame = await comm.receive_from(timeout=5)
    assert 'id="guard-judges"' in frame
    assert 'data-judge="qwen3guard-0.6b"' in frame
    await comm.disconnect()


async def test_judges_counts_written_off_the_request_path_are_pushed(viewer: Any) -> None:
    from guard import records
    from guard.chain import Stats

    comm = await _open(viewer, "/ws/live/judges/")
    await comm.receive_from(timeout=5)
    stats = Stats()
    stats.answers["qwen3guard-0.6b"] += 3
    await sync_to_async(records.write)(stats)
    frame = await comm.receive_from(timeout=5)
    assert 'data-judge="qwen3guard-0.6b"' in frame
    assert 'data-role="judge-counts">3 / 0<' in frame
    await comm.disconnect()


async def test_a_models_page_hears_of_its_model_only(viewer: Any) -> None:
    comm = await _open(viewer, "/ws/live/models/?model=chat-a")
    snapshot = await comm.receive_from(timeout=5)
    assert "No replicas." in snapshot and "cluster-model-chat-a-" in snapshot

    other = await sync_to_async(Replica.objects.create)(
        model_name="chat-b", reason="waiting to be placed"
    )
    r = await sync_to_async(Replica.objects.create)(
        model_name="chat-a", reason="waiting to be placed"
    )
    # The next frame is chat-a's: chat-b's, made first, was never sent here.
    frame = await comm.receive_from(timeout=5)
    assert f'id="cluster-replica-{r.pk}"' in frame and "hx-swap-oob" not in frame
    assert f'id="cluster-replica-{other.pk}"' not in frame
    await sync_to_async(Replica.objects.filter(pk=r.pk).delete)()
    assert "No replicas." in await comm.receive_from(timeout=5)
    await comm.disconnect()


# An evaluation's page (/ws/live/evals/?eval=ID)


@pytest.mark.parametrize("query", ["", "?eval=", "?eval=x1", "?eval=" + "9" * 30])
async def test_the_evaluations_topic_needs_one_evaluation(viewer: Any, query: str) -> None:
    cookie = await sync_to_async(_cookie)(viewer)
    comm, connected = await _connect(f"/ws/live/evals/{query}", ORIGIN, cookie)
    assert not connected
    await comm.disconnect()


async def test_an_evaluations_page_hears_its_results_arrive_and_its_end(viewer: Any) -> None:
    from guard import evalrun
    from tests.guard.helpers import guard_model
    from tests.guard.test_client import launch, stop

    proc, url = launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard",
        "--ttft", "0", "--tps", "100000",
    )  # fmt: skip
    try:
        await sync_to_async(guard_model)("qwen3guard-0.6b", endpoint=url)
        loaded = await sync_to_async(evalrun.load_set)("coding-ops")
        run = await sync_to_async(evalrun.begin)(
            loaded, ["qwen3guard-0.6b"], surface="console", actor_name="t"
        )
        other = await sync_to_async(evalrun.begin)(
            loaded, ["qwen3guard-0.6b"], surface="console", actor_name="t"
        )
        comm = await _open(viewer, f"/ws/live/evals/?eval={run.pk}")
        first = await comm.receive_from(timeout=5)
        assert 'id="guard-eval-body"' in first and 'data-status="running"' in first
        assert f"0 of {run.texts} answers" in first
        # Another evaluation's results are not this page's: the next frame below is this
        # run's first batch, not the other's end.
        await sync_to_async(evalrun.execute)(other, loaded)
        # The run waits after its first batch until this page has shown it.
        shown = threading.Event()

        def progress(judge: str, done: int, total: int) -> None:
            if done == evalrun.BATCH + 1:
                shown.wait(10)

        def execute() -> None:
            try:
                evalrun.execute(run, loaded, progress=progress)
            finally:
                connection.close()

        # On a thread of its own: the consumer renders on the shared one meanwhile.
        asking = asyncio.ensure_future(sync_to_async(execute, thread_sensitive=False)())
        html = await comm.receive_from(timeout=10)
        assert 'data-status="running"' in html and f"{evalrun.BATCH} of {run.texts} answers" in html
        shown.set()
        seen = [html]
        while 'data-status="done"' not in seen[-1]:
            seen.append(await comm.receive_from(timeout=10))
        await asking
        assert 'data-judge="qwen3guard-0.6b"' in seen[-1] and "answers" not in seen[-1]
        await comm.disconnect()
    finally:
        stop(proc)


def _probe(judge: str) -> None:
    from django.utils import timezone

    from guard.models import JudgeProbe

    JudgeProbe.objects.create(judge=judge, at=timezone.now(), ok=False, error="refused")


async def test_a_dashboard_page_hears_of_its_own_nodes_and_the_counts(
    viewer: Any, monkeypatch: Any
) -> None:
    from cluster import live

    monkeypatch.setattr(live, "DASHBOARD_PAGE", 2)  # pages of two nodes: a b | c d | e
    nodes = {}
    for name in "abcde":
        nodes[name], _ = await sync_to_async(join_node)(f"gpu-{name}", ["nvidia-l4-24gb"])
    second = await _open(viewer, "/ws/live/nodes,models/?nodes_page=2")
    last = await _open(viewer, "/ws/live/nodes,models/?nodes_page=3")
    snapshot = await second.receive_from(timeout=5)
    assert f'id="cluster-node-{nodes["c"].pk}"' in snapshot
    assert f'id="cluster-node-{nodes["a"].pk}"' not in snapshot
    assert 'data-role="page-of">page 2 of 3<' in snapshot
    assert 'data-count="nodes">5<' in snapshot  # the summary counts every node
    await last.receive_from(timeout=5)

    # A node on another page: its count changes, its block is not sent here.
    await sync_to_async(services.set_cordon)(nodes["a"], True)
    frame = await second.receive_from(timeout=5)
    assert 'data-count="nodes-cordoned">1 cordoned<' in frame
    assert f"cluster-node-{nodes['a'].pk}" not in frame
    # One this page shows: replaced in place.
    await sync_to_async(services.set_cordon)(nodes["c"], True)
    frame = await second.receive_from(timeout=5)
    assert f'id="cluster-node-{nodes["c"].pk}"' in frame and "beforeend" not in frame
    assert 'data-role="node-state">cordoned<' in frame
    # A node that joins is added to the page with room (the last), not to a full one.
    while 'data-count="nodes-cordoned">2 cordoned<' not in await last.receive_from(timeout=5):
        pass
    new, _ = await sync_to_async(join_node)("gpu-f", ["nvidia-l4-24gb"])
    frame = await last.receive_from(timeout=5)
    assert 'hx-swap-oob="beforeend:#cluster-nodes"' in frame
    assert f'id="cluster-node-{new.pk}"' in frame
    frame = await second.receive_from(timeout=5)
    assert f"cluster-node-{new.pk}" not in frame and 'data-count="nodes">6<' in frame
    await second.disconnect()
    await last.disconnect()
