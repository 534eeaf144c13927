"""Routes of the cluster's API, mounted under /api/v1/cluster/ and /api/v1/agent/."""

from __future__ import annotations

from django.urls import include, path
from rest_framework.routers import DefaultRouter

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from cluster.api import status, views

router = DefaultRouter()
router.register("nodes", views.NodeViewSet, basename="node")
router.register("cards", views.CardViewSet, basename="card")
router.register("replicas", views.ReplicaViewSet, basename="replica")
router.register("budgets", views.FacilityBudgetViewSet, basename="budget")
router.register("quotas", views.QuotaViewSet, basename="quota")
router.register("join-tokens", views.JoinTokenViewSet, basename="jointoken")
router.register("actions", views.ClusterActionViewSet, basename="clusteraction")

urlpatterns = [
    *router.urls,
    path("status/", status.cluster_status, name="cluster-status"),
    path("models/<name:name>/roll/", views.roll_model, name="model-roll"),
    path("models/<name:name>/demand/", views.demand_model, name="model-demand"),
    path("models/<name:name>/bench/", views.bench_model, name="model-bench"),
    path("gpu-classes/", include("cluster.api.classes")),
]

agent_urlpatterns = [
    path("join", views.agent_join, name="agent-join"),
    path("heartbeat", views.agent_heartbeat, name="agent-heartbeat"),
    path("desired", views.agent_desired, name="agent-desired"),
    path("report", views.agent_report, name="agent-report"),
]
