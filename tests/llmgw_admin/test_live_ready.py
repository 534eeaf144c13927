"""The catalog list's ready column over the live view (``/ws/live/models/?view=catalog``),
through the real ASGI application and a real Redis layer: the snapshot and every push
carry the ready cells of the models the list's filters show, and of no other (htmx would
find no target for them and say so in the console)."""

from __future__ import annotations

from typing import Any

import pytest
from asgiref.sync import sync_to_async

from cluster.models import Replica
from tests.catalog.samples import cpu_model, store
from tests.llmgw_admin.test_live_ws import _open, redis_layer  # noqa: F401 (autouse)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_the_catalog_lists_ready_cells_follow_its_filters_models_only(viewer: Any) -> None:
    from cluster.live import Readiness

    await sync_to_async(store)(cpu_model("chat-a"), cpu_model("other-b"))
    a, b = Readiness("chat-a", 0, 0).dom_id, Readiness("other-b", 0, 0).dom_id
    comm = await _open(viewer, "/ws/live/models/?view=catalog&search=chat&role=")
    snapshot = await comm.receive_from(timeout=5)
    assert f'id="{a}"' in snapshot and ">0/0<" in snapshot
    assert f'id="{b}"' not in snapshot and "cluster-models" not in snapshot

    await sync_to_async(Replica.objects.create)(model_name="other-b", state="ready")
    mine = await sync_to_async(Replica.objects.create)(model_name="chat-a", state="starting")
    # The next frame is chat-a's: other-b's change, made first, was not sent here.
    frame = await comm.receive_from(timeout=5)
    assert f'id="{a}"' in frame and ">0/1<" in frame and f'id="{b}"' not in frame

    def ready() -> None:
        r = Replica.objects.get(pk=mine.pk)
        r.state = "ready"
        r.save()

    await sync_to_async(ready)()
    frame = await comm.receive_from(timeout=5)
    assert f'id="{a}"' in frame and ">1/1<" in frame and 'data-ready="1"' in frame
    await comm.disconnect()
