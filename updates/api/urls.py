"""The updates app's API routes (``updates.views.views``).

``node_patterns`` are mounted at ``/api/v1/updates/``, ``catalog_patterns`` at
``/api/v1/catalog/`` (a model's update actions sit beside the model's own API), before
the catalog's own routes.
"""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from updates.api import views

node_patterns = [
    path("mirror/models/<name:name>/", views.node_manifest, name="mirror-manifest"),
    path("mirror/files/<int:pk>/<path:path>", views.node_file, name="mirror-file"),
    path("mirror/", views.mirror_holdings, name="mirror-holdings"),
    path("runs/", views.runs, name="update-runs"),
]

catalog_patterns = [
    path("models/<name:name>/update-check/", views.update_check, name="update-check"),
    path("models/<name:name>/mirror/", views.model_fetches, name="model-fetches"),
    path("models/<name:name>/update/", views.model_update, name="update"),
    path("models/<name:name>/update/promote/", views.model_promote, name="update-promote"),
    path("models/<name:name>/update/cancel/", views.model_cancel, name="update-cancel"),
    path("models/<name:name>/update/rollback/", views.model_rollback, name="update-rollback"),
]
