"""Routes of the gateway's API, mounted under /api/v1/gateway/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from gateway.api import ClientKeyViewSet

router = DefaultRouter()
router.register("keys", ClientKeyViewSet, basename="clientkey")

urlpatterns = router.urls
