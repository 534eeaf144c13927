"""The updates app's API routes (``updates.views.views``).

``node_patterns`` are mounted at ``/api/v1/updates/``, ``catalog_patterns`` at
``/api/v1/catalog/`` (a model's update actions sit beside the model's own API), before
the catalog's own routes.
"""

from __future__ import annotations

from django.urls import path

from updates.api import views

node_patterns = [
    path("mirror/models/<str:name>/", views.node_manifest, name="mirror-manifest"),
    path("mirror/files/<int:pk>/<path:path>", views.node_file, name="mirror-file"),
    path("mirror/", views.mirror_holdings, name="mirror-holdings"),
    path("runs/", views.runs, name="update-runs"),
]

catalog_patterns = [
    path("models/<str:name>/update-check/", views.update_check, name="update-check"),
    path("models/<str:name>/mirror/", views.model_fetches, name="model-fetches"),
    path("models/<str:name>/update/", views.model_update, name="update"),
    path("models/<str:name>/update/promote/", views.model_promote, name="update-promote"),
    path("models/<str:name>/update/cancel/", views.model_cancel, name="update-cancel"),
    path("models/<str:name>/update/rollback/", views.model_rollback, name="update-rollback"),
]
