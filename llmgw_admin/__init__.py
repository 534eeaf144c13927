"""The llmgw control plane's Django project."""

from __future__ import annotations

from llmgw_admin.celery import app as celery_app

__all__ = ("celery_app",)
