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

from cluster.api.lean import LeanAgentRoutes  # noqa: E402
from gateway.assembly import build  # noqa: E402
from guard.api.lean import GuardCheckRoute  # noqa: E402
from llmgw_admin.routing import websocket_urlpatterns  # noqa: E402
from llmgw_admin.wire import Wired  # noqa: E402
from llmgw_core.bodylimit import BodyLimit  # noqa: E402
from llmgw_core.origins import OriginCheck  # noqa: E402
from updates.lean import MirrorFileRoute  # noqa: E402

# The gateway as `manage.py gateway serve` has it (gateway.assembly), with the console's
# chat in front and, behind it, the agents', guard checks' and mirror files' lean routes,
# then Django.
gateway_assembly = build(
    LeanAgentRoutes(GuardCheckRoute(MirrorFileRoute(BodyLimit(django_asgi_app)))), chat=True
)
gateway_state = gateway_assembly.state
gateway_metrics = gateway_assembly.metrics
gateway = gateway_assembly.gateway

application = ProtocolTypeRouter(
    {
        # /healthz, the Host check, the console's chat and /metrics in front of the
        # gateway's /v1/ (gateway.assembly.LAYERS); agents' heartbeats and desired lists
        # skip Django's stack (cluster/api/lean.py), and so do guard checks
        # (guard/api/lean.py) and the mirror's files sent to nodes (updates/lean.py);
        # Django has the rest, and checks its own hosts, after a body over the limit is
        # refused unread (llmgw_core.bodylimit).
        "http": gateway_assembly.application,
        # A websocket from the console's own origin only, scheme, host and port exact
        # (llmgw_core.origins); the live consoles' frames written to the connection
        # directly (llmgw_admin.wire).
        "websocket": Wired(OriginCheck(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
    }
)

# What was loaded to get here (Django, the apps, their modules) lives as long as the
# process: set it outside the garbage collector's full passes, which otherwise walked it
# all (over 100,000 objects, about 100 ms with every request waiting) every so often.
gc.freeze()
