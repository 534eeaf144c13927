"""The gateway alone: ``/v1/`` and nothing else (``manage.py gateway serve``)."""

from __future__ import annotations

import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_admin.settings")
django.setup()

from gateway.app import Gateway  # noqa: E402

# Importing this starts no thread: the server starts the guard's recorder
# (gateway.server.run), the table's reader starts with the first request.
application = Gateway()
