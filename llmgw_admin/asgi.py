"""The one ASGI application: Django over HTTP and Channels over websockets."""

from __future__ import annotations

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")
# Django must be set up before anything imports models: get_asgi_application() first.
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from cluster.api.lean import LeanAgentRoutes  # noqa: E402
from gateway import refusals, usage  # noqa: E402
from gateway.app import Gateway  # noqa: E402
from gateway.health import HealthRoute  # noqa: E402
from gateway.hosts import HostCheck  # noqa: E402
from gateway.metrics import Metrics, exported  # noqa: E402
from gateway.observe import Fanout  # noqa: E402
from gateway.session import SessionChat  # noqa: E402
from gateway.state import State  # noqa: E402
from gateway.traffic import Traffic  # noqa: E402
from gateway.watch import CanaryWatch  # noqa: E402
from guard.api.lean import GuardCheckRoute  # noqa: E402
from llmgw_admin.routing import websocket_urlpatterns  # noqa: E402

gateway_state = State()
# Who hears each request the gateway served: the canaries' judge (gateway.watch), the
# usage and the refusal records written in batches (gateway.usage, gateway.refusals; the
# server starts their threads), the Prometheus counts (GET /metrics, gateway.metrics).
gateway_metrics = Metrics()
gateway_observer = Fanout(
    CanaryWatch(lambda: gateway_state.table), usage.RECORDER, refusals.RECORDER,
    gateway_metrics, Traffic(),
)  # fmt: skip

gateway = Gateway(
    LeanAgentRoutes(GuardCheckRoute(django_asgi_app)),
    state=gateway_state,
    observer=gateway_observer,
)

application = ProtocolTypeRouter(
    {
        # Agents' heartbeats and desired lists skip Django's stack (cluster/api/lean.py),
        # and so do guard checks (guard/api/lean.py).
        # /v1/ is the gateway's (gateway/app.py): clients' OpenAI-compatible calls.
        # /metrics (gateway/metrics.py) and the console's chat (gateway/session.py) in front.
        # /healthz (gateway/health.py) for a load balancer, as a gateway process's: the
        # web process serves /v1/ too. A host not allowed is refused on /v1/, /metrics
        # and the chat (gateway/hosts.py); Django checks the rest.
        "http": HealthRoute(
            HostCheck(SessionChat(exported(gateway, gateway_metrics), gateway), gateway),
            gateway_state,
        ),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)

# What was loaded to get here (Django, the apps, their modules) lives as long as the
# process: set it outside the garbage collector's full passes, which otherwise walked it
# all (over 100,000 objects, about 100 ms with every request waiting) every so often.
gc.freeze()
