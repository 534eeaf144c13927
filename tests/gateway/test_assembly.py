"""Both ASGI applications are the gateway ``gateway.assembly.build`` makes: the same
layers in front of ``/v1/``, in ``LAYERS``' order, and one State, Metrics and gateway
each (the web process adds the console's chat, and puts Django behind)."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from gateway.assembly import LAYERS
from gateway.path.app import Gateway
from gateway.path.health import HealthRoute
from gateway.path.hosts import HostCheck
from gateway.records.metrics import MetricsRoute, TimedGuard
from gateway.session import SessionChat


def chain(app: Any) -> list[type]:
    """The layers from the outermost to the gateway."""
    out = []
    while not isinstance(app, Gateway):
        out.append(type(app))
        app = app.app
    return [*out, Gateway]


@pytest.mark.parametrize(("where", "chat"), [("gateway.asgi", False), ("llmgw_admin.asgi", True)])
def test_each_application_is_built_by_build_with_the_layers_in_order(
    where: str, chat: bool
) -> None:
    module = importlib.import_module(where)
    http = module.application
    if chat:
        http = http.application_mapping["http"]
    assert [name for name, _ in LAYERS] == ["health", "hosts", "chat", "metrics"]
    expected = [HealthRoute, HostCheck, *([SessionChat] if chat else []), MetricsRoute, Gateway]
    assert chain(http) == expected
    gateway = module.gateway
    assert http.state is gateway.state  # /healthz reads the gateway's own table
    assert isinstance(gateway.guard, TimedGuard)  # the guard's time told to /metrics
    assert gateway.parts in list(module.metrics._gateways if hasattr(module, "metrics")
                           else module.gateway_metrics._gateways)  # fmt: skip
