"""Routes of the gateway's API, mounted under /api/v1/gateway/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from gateway.api.views import (
    ClientKeyViewSet,
    HistoryViewSet,
    PeerViewSet,
    RefusalViewSet,
    UsageViewSet,
)

router = DefaultRouter()
router.register("keys", ClientKeyViewSet, basename="clientkey")
router.register("usage", UsageViewSet, basename="usage")
router.register("refusals", RefusalViewSet, basename="refusal")
router.register("history", HistoryViewSet, basename="history")
router.register("peers", PeerViewSet, basename="peer")

urlpatterns = router.urls
