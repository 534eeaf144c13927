"""Routes of the catalog's API, mounted under /api/v1/catalog/."""

from __future__ import annotations

from rest_framework.routers import DefaultRouter

from catalog.api import views

router = DefaultRouter()
router.register("models", views.ServedModelViewSet, basename="servedmodel")
router.register("changes", views.ChangeRecordViewSet, basename="changerecord")

urlpatterns = router.urls
