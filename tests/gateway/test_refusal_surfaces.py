"""Where operators find the guard's refusal records: the console's list (from
the traffic page), the API and the admin, each by role; filters by request id, key,
model and direction; a filter that cannot be read is a 400 saying which, never a 500."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from gateway.models import Refusal, Usage

pytestmark = pytest.mark.django_db

NOW = timezone.now().replace(microsecond=0)


def refusal(request_id: str, minutes_ago: int = 0, **kw: Any) -> Refusal:
    values: dict[str, Any] = {"at": NOW - dt.timedelta(minutes=minutes_ago),
                              "request_id": request_id, "direction": "request", "model": "chat",
                              "key": "app", "owner": "team:t", "judge": "judge",
                              "verdict": "unsafe", "categories": ["Violent"], "score": 0.97}  # fmt: skip
    values.update(kw)
    return Refusal.objects.create(**values)


@pytest.fixture
def rows() -> None:
    refusal("req_old", 30)
    refusal("req_answer", 20, direction="answer", model="talk", key="bot", categories=[])
    refusal("req_closed", 10, judge="", verdict="", categories=[], score=None, judged=False,
            failures=[{"judge": "judge", "kind": "timeout"}])  # fmt: skip
    refusal("req_new", 0, key="bot")


# The API.


def test_viewers_list_refusals_newest_first_and_filter_them(
    rows: None, viewer: Any, outsider: Any, api_for: Any, client: Any
) -> None:
    api = api_for(viewer)
    listed = api.get("/api/v1/gateway/refusals/")
    assert listed.status_code == 200
    body = listed.json()
    assert body["count"] == 4
    assert [r["request_id"] for r in body["results"]] == [
        "req_new", "req_closed", "req_answer", "req_old"]  # fmt: skip
    assert body["results"][1] == {
        "at": (NOW - dt.timedelta(minutes=10)).astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "request_id": "req_closed", "direction": "request", "model": "chat", "key": "app",
        "owner": "team:t", "judge": "", "verdict": "", "categories": [], "score": None,
        "judged": False, "failures": [{"judge": "judge", "kind": "timeout"}],
    }  # fmt: skip

    def ids(**query: str) -> list[str]:
        got = api.get("/api/v1/gateway/refusals/", query)
        assert got.status_code == 200, got.content
        return [r["request_id"] for r in got.json()["results"]]

    assert ids(request_id="req_answer") == ["req_answer"]
    assert ids(request_id="req_nope") == []
    assert ids(key="bot") == ["req_new", "req_answer"]
    assert ids(model="talk") == ["req_answer"]
    assert ids(direction="answer") == ["req_answer"]
    assert ids(key="app", direction="request") == ["req_closed", "req_old"]
    assert ids(at__gte=(NOW - dt.timedelta(minutes=15)).isoformat()) == ["req_new", "req_closed"]


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"direction": "sideways"}, "direction"),
        ({"at__gte": "yesterday"}, "at__gte"),
        ({"request_id": "req_\x00"}, "request_id"),
        ({"request_id": "r" * 41}, "request_id"),
        ({"key": "k\x00"}, "key"),
    ],
)
def test_a_filter_the_api_cannot_read_is_a_400_naming_it(
    rows: None, viewer: Any, api_for: Any, query: dict[str, str], field: str
) -> None:
    got = api_for(viewer).get("/api/v1/gateway/refusals/", query)
    assert got.status_code == 400
    assert got.json()["errors"][0]["field"] == field


def test_the_api_is_read_only_and_for_roles_only(
    rows: None, viewer: Any, operator: Any, outsider: Any, api_for: Any, client: Any
) -> None:
    assert api_for(outsider).get("/api/v1/gateway/refusals/").status_code == 403
    assert client.get("/api/v1/gateway/refusals/").status_code in (401, 403)
    for user in (viewer, operator):
        api = api_for(user)
        assert api.post("/api/v1/gateway/refusals/", {}).status_code in (403, 405)
        assert api.delete("/api/v1/gateway/refusals/1/").status_code in (403, 404, 405)
    assert Refusal.objects.count() == 4


# The console.


def page_ids(html: str) -> list[str]:
    import re

    return re.findall(r'<tr data-request-id="([^"]+)"', html)


def test_the_traffic_page_leads_to_the_refusals_newest_first(
    rows: None, viewer: Any, client_for: Any
) -> None:
    c = client_for(viewer)
    traffic = c.get("/gateway/traffic/").content.decode()
    assert 'href="/gateway/refusals/"' in traffic
    got = c.get("/gateway/refusals/")
    assert got.status_code == 200
    html = got.content.decode()
    assert page_ids(html) == ["req_new", "req_closed", "req_answer", "req_old"]
    assert "4 refusals" in html and "Kept 30 days" in html
    assert "none answered" in html  # the fail-closed one: no judge answered
    assert 'data-role="failures"> judge: timeout</span>' in html  # and which failed, how
    assert 'aria-current="page">Traffic' in html


def test_the_console_filters_by_request_id_key_model_and_direction(
    rows: None, viewer: Any, client_for: Any
) -> None:
    c = client_for(viewer)

    def ids(**query: str) -> list[str]:
        got = c.get("/gateway/refusals/", query)
        assert got.status_code == 200
        return page_ids(got.content.decode())

    assert ids(request_id="req_answer") == ["req_answer"]
    assert ids(request_id="  req_answer ") == ["req_answer"]  # pasted with spaces
    assert ids(key="bot") == ["req_new", "req_answer"]
    assert ids(model="talk") == ["req_answer"]
    assert ids(direction="request", key="app") == ["req_closed", "req_old"]
    html = c.get("/gateway/refusals/", {"request_id": "req_nope"}).content.decode()
    assert "No refusal matches these filters." in html and 'value="req_nope"' in html


def test_the_console_pages_fifty_at_a_time(db: Any, viewer: Any, client_for: Any) -> None:
    Refusal.objects.bulk_create(
        [
            Refusal(
                at=NOW - dt.timedelta(seconds=i),
                request_id=f"req_{i:03}",
                direction="answer",
                key="bot" if i % 2 else "app",
            )
            for i in range(120)
        ]
    )
    c = client_for(viewer)
    first = c.get("/gateway/refusals/").content.decode()
    assert page_ids(first) == [f"req_{i:03}" for i in range(50)]
    assert "page 1 of 3" in first and 'href="?page=2" rel="next"' in first
    third = c.get("/gateway/refusals/", {"page": "3"}).content.decode()
    assert page_ids(third) == [f"req_{i:03}" for i in range(100, 120)]
    assert 'rel="next"' not in third
    # The filters go with the pages' links.
    bots = c.get("/gateway/refusals/", {"key": "bot", "page": "2"}).content.decode()
    assert page_ids(bots) == [f"req_{i:03}" for i in range(101, 120, 2)]
    assert 'href="?key=bot&amp;page=1" rel="prev"' in bots
    # Past the last page: the last page.
    assert page_ids(c.get("/gateway/refusals/", {"page": "99"}).content.decode())[0] == "req_100"


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ({"direction": "sideways"}, "direction: Select a valid choice."),
        ({"page": "two"}, "page: &#x27;two&#x27; is no page number"),
        ({"page": "0"}, "page: &#x27;0&#x27; is no page number"),
        ({"page": "²"}, "is no page number"),
        ({"request_id": "req_\x00"}, "request_id: Null characters are not allowed."),
        ({"key": "k" * 101}, "key: Ensure this value has at most 100 characters"),
    ],
)
def test_a_filter_the_console_cannot_read_is_a_400_saying_which(
    rows: None, viewer: Any, client_for: Any, query: dict[str, str], says: str
) -> None:
    got = client_for(viewer).get("/gateway/refusals/", query)
    assert got.status_code == 400
    html = got.content.decode()
    assert 'id="refusal-errors"' in html and says in html
    assert page_ids(html) == []


def test_the_console_list_is_for_roles_only(
    rows: None, outsider: Any, client_for: Any, client: Any
) -> None:
    assert client_for(outsider).get("/gateway/refusals/").status_code == 403
    anonymous = client.get("/gateway/refusals/")
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert client_for(outsider).post("/gateway/refusals/").status_code in (403, 405)


def test_the_chat_page_links_a_refusal_to_its_record(viewer: Any, client_for: Any) -> None:
    html = client_for(viewer).get("/gateway/chat/").content.decode()
    assert 'data-refusals-path="/gateway/refusals/"' in html


# The admin: read-only.


def test_the_admin_shows_refusals_and_usage_read_only(
    rows: None, viewer: Any, admin_user: Any, client_for: Any
) -> None:
    Usage.objects.create(minute=NOW.replace(second=0), key="app", model="chat", requests=3)
    for user in (viewer, admin_user):
        c = client_for(user)
        listed = c.get("/admin/gateway/refusal/")
        assert listed.status_code == 200 and "req_closed" in listed.content.decode()
        found = c.get("/admin/gateway/refusal/", {"q": "req_answer"}).content.decode()
        assert "req_answer" in found and "req_closed" not in found
        assert c.get("/admin/gateway/usage/").status_code == 200
        assert c.get("/admin/gateway/refusal/add/").status_code == 403
        assert c.get("/admin/gateway/usage/add/").status_code == 403
        pk = Refusal.objects.get(request_id="req_old").pk
        assert c.post(f"/admin/gateway/refusal/{pk}/delete/", {"post": "yes"}).status_code == 403
        change = c.get(f"/admin/gateway/refusal/{pk}/change/")
        assert (
            change.status_code == 200
            and 'type="submit" value="Save"' not in change.content.decode()
        )
    assert Refusal.objects.count() == 4
