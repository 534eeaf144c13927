"""The gateway put together, for both ASGI applications: ``build()``.

``manage.py gateway serve`` (``gateway.asgi``) and the web process (``llmgw_admin.asgi``)
serve the same gateway: one ``State`` (the table in memory), one ``Metrics``, the same
listeners, and the same layers in front of ``/v1/``. The web process adds the
console's chat and puts Django (and the lean routes) behind the gateway.

The layers are one ordered list, ``LAYERS``, outermost first; a request meets them in
that order before the gateway's own ``/v1/`` (``gateway.path.app``), and what none of them
answers goes to the app behind the gateway. A new layer in front of ``/v1/`` (admission,
say) is a line in that list; a new step inside a completion's walk goes in
``Gateway.complete``.

Building starts no thread: the server starts the guard's recorder, the usage recorder
and the refusals' (``gateway.server.run``, ``llmgw_admin.server``), and the table's
reader and the traffic's thread (``Assembly.traffic``: the console's traffic and the load
report for scaling, so requests waiting on a process that has answered none yet are
counted) once it listens; the change events' listener and the canary watch start with the
first request.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.path.app import App, Gateway
from gateway.path.health import HealthRoute
from gateway.path.hosts import HostCheck
from gateway.records import history, refusals, usage
from gateway.records.metrics import Metrics, MetricsRoute, exported
from gateway.records.observe import Fanout
from gateway.records.state import State
from gateway.records.traffic import Traffic
from gateway.records.watch import CanaryWatch
from gateway.session import SessionChat


@dataclass
class Assembly:
    """What ``build`` made: the parts, and the application in front of them."""

    state: State
    metrics: Metrics
    gateway: Gateway
    application: Any
    chat: bool
    traffic: Traffic | None = None  # its thread started by the server (``start()``)


Layer = Callable[[Any, Assembly], Any]

# The layers in front of the gateway, outermost first: (name, how it wraps what is inside
# it). Each answers its own paths and hands anything else inward.
LAYERS: list[tuple[str, Layer]] = [
    # /healthz for anyone: what a load balancer asks (has this process read its table,
    # and can it read it again).
    ("health", lambda app, a: HealthRoute(app, a.state)),
    # A Host not in LLMGW_ALLOWED_HOSTS refused on /v1/, /metrics and the chat, counted
    # as every answer of the gateway is.
    ("hosts", lambda app, a: HostCheck(app, a.gateway.parts)),
    # The console's chat with the signed-in user's session (the web process only).
    ("chat", lambda app, a: SessionChat(app, a.gateway) if a.chat else app),
    # GET /metrics for a viewer's token (the gateway's counts, its guard's time).
    ("metrics", lambda app, a: MetricsRoute(app)),
]


def build(inner: App | None = None, *, chat: bool = False) -> Assembly:
    """The gateway with ``inner`` behind it (None: a 404 for anything not its own), and
    ``chat``: the console's chat in front of it (the web process's)."""
    state = State()
    metrics = Metrics()
    # Who hears each request: the canaries' judge, the usage and the refusal records
    # written in batches, the Prometheus counts (GET /metrics), the console's traffic.
    traffic = Traffic()
    observer = Fanout(
        CanaryWatch(lambda: state.table),
        usage.RECORDER,
        refusals.RECORDER,
        metrics,
        traffic,
        history.RECORDER,  # traffic over time per model (gateway.records.history)
    )
    gateway = Gateway(inner, state=state, observer=observer)
    # Its load too, each second with its traffic, for the reconciler's scaling.
    traffic.report_load(gateway.parts)
    traffic.watch_sessions(gateway.sessions)  # its sessions kept on their replicas
    exported(gateway.parts, metrics)  # its in-flight counts and its guard's time told to metrics
    assembly = Assembly(state, metrics, gateway, gateway, chat, traffic)
    application: Any = gateway
    for _, layer in reversed(LAYERS):
        application = layer(application, assembly)
    assembly.application = application
    return assembly
