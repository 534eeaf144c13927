"""Secrets shown once through the API (API tokens, join tokens; one pair of actions,
``llmgw_core.shownonce.ShownOnceActions``): the secret is in the create's answer alone, which no
cache keeps; it works until revoked, and a second revoke changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.models import ClusterAction, JoinToken
from llmgw_core.models import ApiToken

pytestmark = pytest.mark.django_db

KINDS = {
    "api": ("/api/v1/tokens/", {"user": "ada", "name": "ci"}, ApiToken),
    "join": ("/api/v1/cluster/join-tokens/", {"name": "rack-7", "max_uses": 2}, JoinToken),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_secret_is_shown_once_never_cached_and_revoked_once(
    kind: str, api_for: Any, admin_user: Any
) -> None:
    url, body, model = KINDS[kind]
    api = api_for(admin_user)
    made = api.post(url, body, format="json")
    assert made.status_code == 201, made.json()
    assert made["Cache-Control"] == "no-store"
    secret = made.json()["token"]
    assert secret and model.objects.get(pk=made.json()["id"]).digest != secret
    listed = api.get(url).json()["results"]
    assert [row["id"] for row in listed] == [made.json()["id"]]
    assert "token" not in listed[0]

    logged = ClusterAction.objects.count()
    first = api.post(f"{url}{made.json()['id']}/revoke/")
    assert first.status_code == 200 and first.json()["revoked"]
    again = api.post(f"{url}{made.json()['id']}/revoke/")
    assert again.status_code == 200 and again.json()["revoked"] == first.json()["revoked"]
    # The join token's revoke is logged, once; the API token's is not logged here.
    assert ClusterAction.objects.count() - logged == (1 if kind == "join" else 0)
