"""The updates app's API routes (``updates.api``).

``node_patterns`` are mounted at ``/api/v1/updates/``, ``catalog_patterns`` at
``/api/v1/catalog/`` (a model's update actions sit beside the model's own API), before
the catalog's own routes.
"""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from updates import api, flowapi

node_patterns = [
    path("mirror/models/<name:name>/", api.node_manifest, name="mirror-manifest"),
    path("mirror/files/<int:pk>/<path:path>", api.node_file, name="mirror-file"),
    path("mirror/", api.mirror_holdings, name="mirror-holdings"),
    # The update flow's (updates.flowapi).
    path("runs/", flowapi.runs, name="update-runs"),
]

catalog_patterns = [
    path("models/<name:name>/update-check/", api.update_check, name="update-check"),
    path("models/<name:name>/mirror/", api.model_fetches, name="model-fetches"),
    # The update flow's (updates.flowapi).
    path("models/<name:name>/update/", flowapi.model_update, name="update"),
    path("models/<name:name>/update/promote/", flowapi.model_promote, name="update-promote"),
    path("models/<name:name>/update/cancel/", flowapi.model_cancel, name="update-cancel"),
    path("models/<name:name>/update/rollback/", flowapi.model_rollback, name="update-rollback"),
]
