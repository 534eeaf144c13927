"""Routes of the cluster's console, mounted under /cluster/."""

from __future__ import annotations

from django.urls import path

from cluster import views

app_name = "cluster"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("heartbeats/", views.heartbeats, name="heartbeats"),
    path("nodes/<int:pk>/<str:action>/", views.node_action, name="node_action"),
    path("replicas/<int:pk>/restart/", views.replica_restart, name="replica_restart"),
    path("models/<path:name>/roll/", views.model_roll, name="model_roll"),
]
