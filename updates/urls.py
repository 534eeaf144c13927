"""Console routes of the updates app, mounted at ``/updates/``."""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from updates import flowviews, views

app_name = "updates"

urlpatterns = [
    path("mirror/", views.mirror_page, name="mirror"),
    path("models/<name:name>/panel/", views.model_panel, name="model_panel"),
    path("models/<name:name>/check/", views.model_check, name="model_check"),
    path("models/<name:name>/fetch/", views.model_fetch, name="model_fetch"),
    # The update flow's (updates.flowviews).
    path("", flowviews.updates_page, name="list"),
    path("models/<name:name>/update/", flowviews.model_update, name="model_update"),
    path("models/<name:name>/promote/", flowviews.model_promote, name="model_promote"),
    path("models/<name:name>/rollback/", flowviews.model_rollback, name="model_rollback"),
    path("models/<name:name>/cancel/", flowviews.model_cancel, name="model_cancel"),
]
