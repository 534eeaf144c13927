"""Console routes of the updates app, mounted at ``/updates/``."""

from __future__ import annotations

from django.urls import path

from updates import views

app_name = "updates"

urlpatterns = [
    path("mirror/", views.mirror_page, name="mirror"),
    path("models/<str:name>/panel/", views.model_panel, name="model_panel"),
    path("models/<str:name>/check/", views.model_check, name="model_check"),
]
