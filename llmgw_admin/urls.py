"""Root routes: the console, the admin, the API and its schema."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from cluster import urls as cluster_urls
from cluster.api.urls import agent_urlpatterns
from llmgw_admin.api import views as api_views
from llmgw_admin.throttle import LoginForm
from llmgw_admin.views import status, tokens
from llmgw_admin.views.dashboard import dashboard
from llmgw_core.roles import VIEWER, role_required
from updates.api import urls as updates_api_urls

access_router = DefaultRouter()
access_router.register("tokens", api_views.ApiTokenViewSet, basename="apitoken")

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="cluster:dashboard"), name="home"),
    path(
        "login/",
        auth_views.LoginView.as_view(
            template_name="login.html",
            redirect_authenticated_user=True,
            authentication_form=LoginForm,
        ),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("catalog/", include("catalog.urls")),
    path("guard/", include("guard.urls")),
    path("gateway/", include("gateway.urls")),
    path("cluster/reconciler/", status.reconciler, name="cluster-reconciler"),
    # The dashboard is the console's home (llmgw_admin.views.dashboard); it keeps its name in
    # the cluster's namespace, beside the cluster's actions (cluster.urls).
    path(
        "cluster/",
        include(([path("", dashboard, name="dashboard"), *cluster_urls.urlpatterns], "cluster")),
    ),
    path("tokens/", tokens.tokens, name="tokens"),
    path("tokens/<str:kind>/", tokens.token_issue, name="token_issue"),
    path("tokens/<str:kind>/<int:pk>/revoke/", tokens.token_revoke, name="token_revoke"),
    path("favicon.ico", tokens.favicon, name="favicon"),
    # API tokens' admin pages moved with their model to the framework (llmgw_core);
    # an operator's bookmark of the old address still lands on them.
    re_path(
        r"^admin/llmgw_admin/apitoken/(?P<rest>.*)$",
        RedirectView.as_view(url="/admin/llmgw_core/apitoken/%(rest)s", query_string=True),
    ),
    path("admin/", admin.site.urls),
    path("api/v1/catalog/", include((updates_api_urls.catalog_patterns, "updates-catalog"))),
    path("api/v1/catalog/", include("catalog.api.urls")),
    path("api/v1/updates/", include((updates_api_urls.node_patterns, "updates-api"))),
    path("updates/", include("updates.urls")),
    path("api/v1/cluster/", include(("cluster.api.urls", "cluster-api"))),
    path("api/v1/agent/", include((agent_urlpatterns, "agent"))),
    path("api/v1/guard/", include(("guard.api.urls", "guard-api"))),
    path("api/v1/gateway/", include(("gateway.api.urls", "gateway-api"))),
    path("api/v1/", include(access_router.urls)),
    # The schema is read by viewers (SPECTACULAR_SETTINGS' SERVE_PERMISSIONS), as the docs.
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path(
        "api/docs/",
        role_required(VIEWER)(
            SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="api_docs.html")
        ),
        name="api-docs",
    ),
]

# PostgreSQL away or hung, wherever it is met on a request's way: 503 with Retry-After.
handler500 = "llmgw_admin.dbdown.server_error"
