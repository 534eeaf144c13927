"""API tokens: a user issues them for itself only, a superuser for anyone (logged as such),
never through a token; every token says who made it, in the API, the admin and the CLI."""

from __future__ import annotations

import io
import logging
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from rest_framework.test import APIClient

from llmgw_core.models import ApiToken

pytestmark = pytest.mark.django_db

URL = "/api/v1/tokens/"


@pytest.fixture
def superuser(db: Any) -> Any:
    return User.objects.create_superuser("admin", "admin@example.com", "x")


def test_an_admin_role_user_may_not_issue_a_token_for_another_user(
    api_for: Any, admin_user: Any, superuser: Any, operator: Any
) -> None:
    api = api_for(admin_user)
    for other in ("admin", "otto"):
        r = api.post(URL, {"user": other, "name": "mine-now"}, format="json")
        assert r.status_code == 403, r.json()
        assert r.json()["detail"].startswith("you may issue tokens for yourself (ada) only")
    assert not ApiToken.objects.exists()
    r = api.post(URL, {"user": "ada", "name": "ci"}, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["created_by"] == "ada"
    assert api.get(URL).json()["results"][0]["created_by"] == "ada"


def test_a_superuser_issues_for_another_user_and_it_is_logged(
    api_for: Any, superuser: Any, operator: Any, caplog: Any
) -> None:
    with caplog.at_level(logging.INFO, logger="llmgw.tokens"):
        r = api_for(superuser).post(URL, {"user": "otto", "name": "ci"}, format="json")
    assert r.status_code == 201, r.json()
    assert r.json()["user"] == "otto" and r.json()["created_by"] == "admin"
    token = ApiToken.objects.get()
    assert token.created_by == superuser
    said = [rec.getMessage() for rec in caplog.records if rec.name == "llmgw.tokens"]
    assert said == [f"API token {token.pk} (ci) for otto issued by admin (superuser)"]


def test_a_token_cannot_issue_tokens(api_for: Any, superuser: Any) -> None:
    secret = api_for(superuser).post(URL, {"user": "admin", "name": "s"}, format="json").json()
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Bearer {secret['token']}")
    for who in ("admin", "otto-not-needed"):
        r = script.post(URL, {"user": "admin", "name": f"more-{who}"}, format="json")
        assert r.status_code == 403, r.json()
        assert "a token cannot issue tokens" in r.json()["detail"]
    assert ApiToken.objects.count() == 1


def test_the_admin_page_refuses_another_users_token_and_lists_who_made_each(
    client_for: Any, admin_user: Any, superuser: Any
) -> None:
    page = client_for(admin_user)
    r = page.post("/admin/llmgw_core/apitoken/add/", {"user": superuser.pk, "name": "x"})
    assert r.status_code == 200  # the form again, with the reason
    assert "you may issue tokens for yourself (ada) only" in r.content.decode()
    assert not ApiToken.objects.exists()
    r = page.post("/admin/llmgw_core/apitoken/add/", {"user": admin_user.pk, "name": "x"})
    assert r.status_code == 302
    assert ApiToken.objects.get().created_by_name == "ada"
    assert (
        '<td class="field-created_by_name">ada</td>'
        in page.get("/admin/llmgw_core/apitoken/").content.decode()
    )


def test_the_command_line_says_it_made_the_token(operator: Any) -> None:
    out = io.StringIO()
    call_command("token", "create", "otto", "cli", stdout=out)
    token = ApiToken.objects.get()
    assert token.created_by is None and token.created_by_name.startswith("command line (")
    out = io.StringIO()
    call_command("token", "list", stdout=out)
    assert f"by {token.created_by_name}" in out.getvalue()


def test_the_consoles_tokens_page_refuses_another_users_token_and_says_who_made_each(
    client_for: Any, admin_user: Any, operator: Any
) -> None:
    page = client_for(admin_user)
    r = page.post("/tokens/api/", {"api-user": "otto", "api-name": "x"})
    assert r.status_code == 400
    assert "you may issue tokens for yourself (ada) only" in r.content.decode()
    assert not ApiToken.objects.exists()
    r = page.post("/tokens/api/", {"api-user": "ada", "api-name": "x"})
    assert r.status_code == 200 and ApiToken.objects.get().created_by == admin_user
    listed = page.get("/tokens/").content.decode()
    assert '<td class="small" data-role="created-by">ada</td>' in listed
