"""The gateway alone (``manage.py gateway serve``): ``/v1/``, ``GET /metrics`` for a viewer's
token (``gateway.metrics``) and ``GET /healthz`` for anyone (``gateway.health``); a host
not in ``LLMGW_ALLOWED_HOSTS`` is refused on the first two (``gateway.hosts``)."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")
django.setup()

from gateway import refusals, usage  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.health import HealthRoute  # noqa: E402
from gateway.hosts import HostCheck  # noqa: E402
from gateway.metrics import Metrics, exported  # noqa: E402
from gateway.observe import Fanout  # noqa: E402
from gateway.state import State  # noqa: E402
from gateway.traffic import Traffic  # noqa: E402
from gateway.watch import CanaryWatch  # noqa: E402

# Importing this starts no thread: the server starts the guard's recorder, the usage
# recorder and the refusals' (gateway.server.run), and the table's reader once it listens;
# the change events' listener and the canary watch start with the first request.
state = State()
metrics = Metrics()
gateway = Gateway(
    state=state,
    # Who hears each request: the canaries' judge, the usage and the refusal records
    # written in batches, the Prometheus counts (GET /metrics, gateway.metrics).
    observer=Fanout(
        CanaryWatch(lambda: state.table),
        usage.RECORDER,
        refusals.RECORDER,
        metrics,
        Traffic(),
    ),
)
application = HealthRoute(
    HostCheck(
        exported(gateway, metrics),
        gateway,
    ),
    # What a load balancer asks (no credential): has this process read its table, and
    # can it read it again (stale, with its age).
    state,
)
