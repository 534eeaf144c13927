"""The update flow's API (updates.api): start, read, promote, rollback, list; roles."""

from __future__ import annotations

from typing import Any

import pytest

from catalog.models import ChangeRecord
from tests.updates.test_flow_run import chat, fetched, ready, spec  # noqa: F401 - fixtures
from updates.models import UpdateRun

pytestmark = pytest.mark.django_db

URL = "/api/v1/catalog/models/chat/update/"


def test_an_operator_starts_an_update_and_a_second_is_refused_naming_it(
    chat: str,  # noqa: F811
    api_for: Any,
    operator: Any,
) -> None:
    api = api_for(operator)
    started = api.post(URL, {"canary_percent": 20}, format="json")
    assert started.status_code == 202, started.content
    body = started.json()
    assert (body["model"], body["state"], body["step"]) == ("chat", "running", "fetch")
    assert body["started_by"].startswith(operator.username) and body["surface"] == "api"
    again = api.post(URL, {}, format="json")
    assert again.status_code == 400
    assert f"#{body['id']}" in again.json()["detail"]
    assert UpdateRun.objects.count() == 1
    assert api.get(URL).json()["id"] == body["id"]
    listed = api.get("/api/v1/updates/runs/?state=running").json()["results"]
    assert [r["model"] for r in listed] == ["chat"]


@pytest.mark.parametrize(
    ("body", "field"),
    [({"canary_percent": 101}, "canary_percent"), ({"auto": "maybe"}, "auto"),
     ({"colour": 1}, "colour"), ({"revision": "f" * 40}, "")],
)  # fmt: skip
def test_a_wrong_body_is_400_naming_the_field_and_starts_nothing(
    chat: str,  # noqa: F811
    api_for: Any,
    operator: Any,
    body: dict,
    field: str,  # noqa: F811
) -> None:
    answer = api_for(operator).post(URL, body, format="json")
    if field:
        assert answer.status_code == 400, answer.content
        assert answer.json()["errors"][0]["field"] == field
    if not field:  # a revision the registry does not know: refused, saying so
        assert answer.status_code == 400 and "chat:" in answer.json()["detail"]
    assert UpdateRun.objects.filter(model="chat").count() == 0


def test_a_viewer_reads_and_may_not_start_promote_or_roll_back(
    chat: str,  # noqa: F811
    api_for: Any,
    viewer: Any,
) -> None:
    api = api_for(viewer)
    for path in (URL, URL + "promote/", URL + "rollback/"):
        assert api.post(path, {}, format="json").status_code == 403
    assert api.get(URL).status_code == 404  # not updated yet
    assert UpdateRun.objects.count() == 0


def test_promote_and_rollback_through_the_api(chat: str, api_for: Any, operator: Any) -> None:  # noqa: F811
    api = api_for(operator)
    refused = api.post(URL + "rollback/").json()["detail"]
    assert refused.startswith('"chat" has no previous revision to go back to: it is at ')
    assert refused.endswith("the first revision it was fetched or updated to; nothing was rolled")
    posted = api.post(URL, {}, format="json").json()
    r = ready(fetched(UpdateRun.objects.get(pk=posted["id"])))
    assert r.state == "waiting"
    promoted = api.post(URL + "promote/")
    assert promoted.status_code == 200 and promoted.json()["state"] == "promoted"
    back = api.post(URL + "rollback/")
    assert back.status_code == 200 and back.json()["detail"].startswith("chat is back at")
    record = ChangeRecord.objects.filter(model_name="chat").first()
    assert record.surface == "api" and operator.username in record.actor_name


def test_an_unknown_model_is_404(api_for: Any, operator: Any) -> None:
    api = api_for(operator)
    for path in (
        "/api/v1/catalog/models/nope/update/",
        "/api/v1/catalog/models/nope/update/rollback/",
    ):
        assert api.post(path, {}, format="json").status_code == 404


def test_cancel_through_the_api(chat: str, api_for: Any, operator: Any, viewer: Any) -> None:  # noqa: F811
    api = api_for(operator)
    assert api.post(URL + "cancel/").status_code == 400
    api.post(URL, {}, format="json")
    assert api_for(viewer).post(URL + "cancel/").status_code == 403
    done = api.post(URL + "cancel/")
    assert done.status_code == 200 and done.json()["reason"].startswith(
        f"cancelled by {operator.username}"
    )
