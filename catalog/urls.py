"""Routes of the catalog's console pages and fragments, mounted under /catalog/."""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from catalog.views import form, pages, schedule

app_name = "catalog"

# Names may hold a slash (org/model), so they are matched as paths; the fixed routes
# and the longer ones come first.
urlpatterns = [
    path("", pages.servedmodel_list, name="servedmodel_list"),
    # Outside models/ so that no model name (not even "new") is shadowed by them.
    path("new/", form.servedmodel_add, name="servedmodel_add"),
    path("validate/", form.servedmodel_validate, name="servedmodel_validate"),
    path("rows/<str:group>/", form.servedmodel_formrow, name="servedmodel_formrow"),
    path("models/<name:name>/edit/", form.servedmodel_edit, name="servedmodel_edit"),
    path("models/<name:name>/delete/", pages.servedmodel_delete, name="servedmodel_delete"),
    path(
        "models/<name:name>/schedule/check/",
        schedule.servedmodel_schedule_check,
        name="servedmodel_schedule_check",
    ),
    path(
        "models/<name:name>/schedule/",
        schedule.servedmodel_schedule,
        name="servedmodel_schedule",
    ),
    path(
        "models/<name:name>/changes/<int:pk>/revert/",
        pages.changerecord_revert,
        name="changerecord_revert",
    ),
    path("models/<name:name>/", pages.servedmodel_detail, name="servedmodel_detail"),
]
