"""The updates app's API routes (``updates.api``).

``node_patterns`` are mounted at ``/api/v1/updates/``, ``catalog_patterns`` at
``/api/v1/catalog/`` (a model's update actions sit beside the model's own API), before
the catalog's own routes.
"""

from __future__ import annotations

from django.urls import path

from updates import api

node_patterns = [
    path("mirror/models/<str:name>/", api.node_manifest, name="mirror-manifest"),
    path("mirror/files/<int:pk>/<path:path>", api.node_file, name="mirror-file"),
]

catalog_patterns = [
    path("models/<str:name>/update-check/", api.update_check, name="update-check"),
]
