"""Routes of the guard's API, mounted under /api/v1/guard/."""

from __future__ import annotations

from django.urls import path

from guard.api import enable, views

urlpatterns = [
    path("check", views.check, name="guard-check"),
    path("policy", views.policy, name="guard-policy"),
    path("judges", views.judges, name="guard-judges"),
    path("judges/enable", enable.enable, name="guard-judge-enable"),
]
