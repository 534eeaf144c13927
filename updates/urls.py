"""Console routes of the updates app, mounted at ``/updates/``."""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from updates import views

app_name = "updates"

urlpatterns = [
    path("mirror/", views.mirror_page, name="mirror"),
    path("models/<name:name>/panel/", views.model_panel, name="model_panel"),
    path("models/<name:name>/check/", views.model_check, name="model_check"),
    path("models/<name:name>/fetch/", views.model_fetch, name="model_fetch"),
    path("", views.updates_page, name="list"),
    path("models/<name:name>/update/", views.model_update, name="model_update"),
    path("models/<name:name>/promote/", views.model_promote, name="model_promote"),
    path("models/<name:name>/rollback/", views.model_rollback, name="model_rollback"),
    path("models/<name:name>/cancel/", views.model_cancel, name="model_cancel"),
]
