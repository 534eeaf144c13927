"""Routes of the gateway's console pages, mounted under /gateway/."""

from __future__ import annotations

from django.urls import path

from gateway import views

app_name = "gateway"

urlpatterns = [
    path("chat/", views.chat, name="chat"),
    path("chat/state/", views.chat_state, name="chat_state"),
    path("traffic/", views.traffic, name="traffic"),
    path("history/", views.history_page, name="history"),
    path("cache/", views.cache_share, name="cache_share"),
    path("refusals/", views.refusal_list, name="refusal_list"),
    path("batches/", views.batch_list, name="batch_list"),
    path("batches/<str:batch_id>/cancel/", views.batch_cancel, name="batch_cancel"),
    path("keys/", views.key_list, name="key_list"),
    path("keys/create/", views.key_create, name="key_create"),
    path("keys/<int:pk>/revoke/", views.key_revoke, name="key_revoke"),
    path("keys/<int:pk>/revoke/confirm/", views.key_revoke_confirm, name="key_revoke_confirm"),
    path("peers/", views.peer_list, name="peer_list"),
    path("peers/add/", views.peer_add, name="peer_add"),
    path("peers/<str:peer>/remove/", views.peer_remove, name="peer_remove"),
]
