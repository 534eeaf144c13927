"""Routes of the guard's console pages and fragments, mounted under /guard/."""

from __future__ import annotations

from django.urls import path

import catalog.converters  # noqa: F401  (registers <name:…>, any name the catalog holds)
from guard import views

app_name = "guard"

# Judge names may hold a slash (org/model), so they are matched as paths: the longer
# routes come first.
urlpatterns = [
    path("", views.guard_index, name="guard_index"),
    path("judges/", views.judge_list, name="judge_list"),
    path("policy/", views.policy_edit, name="policy_edit"),
    path("enable/", views.judge_enable, name="judge_enable"),
    path("evals/", views.eval_list, name="eval_list"),
    path("evals/run/", views.eval_start, name="eval_start"),
    path("evals/<int:pk>/", views.eval_detail, name="eval_detail"),
    path("judges/<name:name>/health/", views.judge_health, name="judge_health"),
    path("judges/<name:name>/prompt.txt", views.judge_prompt_raw, name="judge_prompt_raw"),
    path("judges/<name:name>/prompt/", views.judge_prompt_view, name="judge_prompt"),
    path("judges/<name:name>/", views.judge_detail, name="judge_detail"),
]
