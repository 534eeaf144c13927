"""Console routes of the updates app, mounted at ``/updates/``."""

from __future__ import annotations

from django.urls import path

from updates import flowviews, views

app_name = "updates"

urlpatterns = [
    path("mirror/", views.mirror_page, name="mirror"),
    path("models/<str:name>/panel/", views.model_panel, name="model_panel"),
    path("models/<str:name>/check/", views.model_check, name="model_check"),
    # The update flow's (updates.flowviews).
    path("", flowviews.updates_page, name="list"),
    path("models/<str:name>/update/", flowviews.model_update, name="model_update"),
    path("models/<str:name>/promote/", flowviews.model_promote, name="model_promote"),
    path("models/<str:name>/rollback/", flowviews.model_rollback, name="model_rollback"),
    path("models/<str:name>/cancel/", flowviews.model_cancel, name="model_cancel"),
]
