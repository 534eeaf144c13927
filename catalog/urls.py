"""Routes of the catalog's console pages and fragments, mounted under /catalog/."""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from catalog import schedule_views, views

app_name = "catalog"

# Names may hold a slash (org/model), so they are matched as paths; the fixed routes
# and the longer ones come first.
urlpatterns = [
    path("", views.servedmodel_list, name="servedmodel_list"),
    # Outside models/ so that no model name (not even "new") is shadowed by them.
    path("new/", views.servedmodel_add, name="servedmodel_add"),
    path("validate/", views.servedmodel_validate, name="servedmodel_validate"),
    path("rows/<str:group>/", views.servedmodel_formrow, name="servedmodel_formrow"),
    path("models/<name:name>/edit/", views.servedmodel_edit, name="servedmodel_edit"),
    path("models/<name:name>/delete/", views.servedmodel_delete, name="servedmodel_delete"),
    path(
        "models/<name:name>/schedule/check/",
        schedule_views.servedmodel_schedule_check,
        name="servedmodel_schedule_check",
    ),
    path(
        "models/<name:name>/schedule/",
        schedule_views.servedmodel_schedule,
        name="servedmodel_schedule",
    ),
    path(
        "models/<name:name>/changes/<int:pk>/revert/",
        views.changerecord_revert,
        name="changerecord_revert",
    ),
    path("models/<name:name>/", views.servedmodel_detail, name="servedmodel_detail"),
]
