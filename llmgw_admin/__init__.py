"""The llmgw control plane's Django project: the wiring on top of the apps (settings,
urls, the ASGI application, the console's home and live view, the commands). The framework
the apps build on is ``llmgw_core``."""

from __future__ import annotations

from llmgw_core.celery import app as celery_app

__all__ = ("celery_app",)
