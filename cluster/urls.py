"""Routes of the cluster's console, mounted under /cluster/ (namespace ``cluster``).

The dashboard itself, ``cluster:dashboard`` at /cluster/, is the console's home and is
wired on top (``llmgw_admin.urls``, ``llmgw_admin.views.dashboard``): it shows every app.
"""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from cluster.views import actions, pages, quotas

app_name = "cluster"

urlpatterns = [
    path("heartbeats/", actions.heartbeats, name="heartbeats"),
    path("quotas/", quotas.quota_list, name="quota_list"),
    path("quotas/set/", quotas.quota_set, name="quota_set"),
    path("quotas/<name:owner>/delete/", quotas.quota_delete, name="quota_delete"),
    path("owners/<name:owner>/", quotas.owner_detail, name="owner_detail"),
    path("nodes/<int:pk>/", pages.node_detail, name="node_detail"),
    path("replicas/<int:pk>/log/", pages.replica_log, name="replica_log"),
    path("nodes/<int:pk>/<str:action>/", actions.node_action, name="node_action"),
    path("replicas/<int:pk>/restart/", actions.replica_restart, name="replica_restart"),
    path("models/<name:name>/roll/", actions.model_roll, name="model_roll"),
    path("models/<name:name>/bench/", actions.model_bench, name="model_bench"),
    path("models/<name:name>/scale/", pages.model_scale, name="model_scale"),
    path("models/<name:name>/wake/", pages.model_wake, name="model_wake"),
]
