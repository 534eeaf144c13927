"""The gateway alone (``manage.py gateway serve``): ``/v1/``, ``GET /metrics`` for a viewer's
token (``gateway.records.metrics``) and ``GET /healthz`` for anyone (``gateway.path.health``); a host
not in ``LLMGW_ALLOWED_HOSTS`` is refused on the first two (``gateway.path.hosts``). Built by
``gateway.assembly.build``, as the web process's gateway is."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")
django.setup()

from gateway.assembly import build  # noqa: E402

# Importing this starts no thread (gateway.assembly).
assembly = build()
state = assembly.state
metrics = assembly.metrics
gateway = assembly.gateway
application = assembly.application
