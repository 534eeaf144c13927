"""What a gateway's request path runs on: one ``Parts``, built by ``Gateway.__init__`` and
handed to each step (``Routing``, ``Judging``, the routes of the dialects, rerank and
batches), never the ``Gateway`` itself.

Each step reads the part it needs at each call, so a part replaced after the gateway was
built (``gateway.records.metrics.exported`` wraps its ``guard``; a test swaps its
``options``) is the one the next request meets. The upstream client, the budgets and the
state shared through Redis are made at the gateway's first request (``Gateway.start``),
in its loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.path.adapters import Placer
    from gateway.path.admission import Admission
    from gateway.path.affinity import Sessions
    from gateway.path.cycle import Cycle
    from gateway.path.guarding import Guard
    from gateway.path.limits import LocalLimits, RedisLimits
    from gateway.path.options import Options
    from gateway.path.outliers import Outliers
    from gateway.path.table import Source
    from gateway.records.observe import Observer
    from gateway.shared import Shared
    from llmgw_core.upstream import Upstream

# A completion's steps from its body on (``Gateway.complete``): what the routes that read
# a body of their own (a dialect's, rerank's, a batch's line) hand it to.
Complete = Callable[["Cycle", str, bytes], Coroutine[Any, Any, None]]


@dataclass(eq=False)
class Parts:
    """The collaborators of one gateway's request path (its ``Gateway`` builds them)."""

    state: Source  # the table it routes by, read off the path (gateway.records.state)
    options: Options
    observer: Observer  # hears how each request ended (gateway.records.observe)
    guard: Guard
    admission: Admission  # lower bands held while a model is past its SLO
    outliers: Outliers  # replicas left out of routing after failures in a row
    placer: Placer  # the adapters each replica holds
    sessions: Sessions  # each session's last replica, per model
    # Requests in flight per replica in this process (the balancer reads them), and of
    # those the ones load scaling leaves out: of keys pinned to a replica (the bench's)
    # and a batch's lines that may not add replicas (gateway.batch).
    in_flight: dict[int, int] = field(default_factory=dict)
    pinned_in_flight: dict[int, int] = field(default_factory=dict)
    # Made at the first request (Gateway.start): the engines' client, the keys' budgets
    # (in Redis when REDIS_URL is set, else this process's), and admission, ejections
    # and breakers shared with the other gateway processes through Redis.
    client: Upstream | None = None
    limits: LocalLimits | RedisLimits | None = None
    shared: Shared | None = None
    background: set[asyncio.Future[Any]] = field(default_factory=set, repr=False)  # later's work

    @property
    def upstream(self) -> Upstream:
        """The engines' client (made at the first request)."""
        assert self.client is not None
        return self.client

    def later(self, work: Awaitable[None]) -> None:
        """Run ``work`` off the request's path, kept until it ends."""
        task = asyncio.ensure_future(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
