"""The gateway alone: ``/v1/`` and nothing else (``manage.py gateway serve``)."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")
django.setup()

from gateway import refusals, usage  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.metrics import Metrics, exported  # noqa: E402
from gateway.observe import Fanout  # noqa: E402
from gateway.state import State  # noqa: E402
from gateway.traffic import Traffic  # noqa: E402
from gateway.watch import CanaryWatch  # noqa: E402

# Importing this starts no thread: the server starts the guard's recorder, the usage
# recorder and the refusals' (gateway.server.run); the table's reader and the canary watch
# start with the first request.
state = State()
metrics = Metrics()
application = exported(
    Gateway(
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
    ),
    metrics,
)
