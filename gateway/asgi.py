"""The gateway alone: ``/v1/`` and nothing else (``manage.py gateway serve``)."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")
django.setup()

from gateway.app import Gateway  # noqa: E402
from guard import records  # noqa: E402

# The guard's decisions are counted by its recorder, written off the request path.
records.start()

application = Gateway()
