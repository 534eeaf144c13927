"""The schedule editor: its page, the live check (errors and the redrawn week), Save, roles.

Through the Django test client on PostgreSQL; the browser side is in
tests/browser/test_schedule_console.py.
"""

from __future__ import annotations

import html as htmllib
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from django.urls import reverse

from catalog.models import ChangeRecord, ServedModel
from tests.catalog.samples import cpu_model, store

pytestmark = pytest.mark.django_db

HX = {"HTTP_HX_REQUEST": "true"}
BAD_FROM = 'scaling.schedule[0]: from "25:00" is not HH:MM, like 08:00'


def page_url(name: str = "small") -> str:
    return reverse("catalog:servedmodel_schedule", args=[name])


def check_url(name: str = "small") -> str:
    return reverse("catalog:servedmodel_schedule_check", args=[name])


class _Scraper(HTMLParser):
    """Collect what a browser would post from the schedule editor."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._inside = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == "schedule-form":
            self._inside = True
        if not self._inside or tag != "input" or not a.get("name"):
            return
        kind = a.get("type", "text")
        if kind == "checkbox":
            if "checked" in a:
                self.data[a["name"] or ""] = a.get("value") or "on"
        elif kind not in ("submit", "button"):
            self.data[a["name"] or ""] = a.get("value") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._inside = False


def scrape(html: str) -> dict[str, str]:
    parser = _Scraper()
    parser.feed(html)
    assert parser.data, "no schedule form on the page"
    return parser.data


def error_at(html: str, name: str) -> str:
    """Return the text of a field's error element (empty when it has none)."""
    m = re.search(
        rf'<div class="field-errors" id="err-{re.escape(name)}"[^>]*>(.*?)</div>', html, re.S
    )
    assert m, f"no error element for {name}"
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", m.group(1))).strip()


def cell(html: str, day: str, hour: int) -> tuple[str, str]:
    """Return a week cell's text and hover text."""
    row = re.search(rf'<tr data-day="{day}">(.*?)</tr>', html, re.S)
    assert row, f"no {day} row"
    m = re.search(rf'<td [^>]*data-hour="{hour}" title="([^"]*)">([^<]*)</td>', row.group(1))
    assert m, f"no {day} {hour}:00 cell"
    return m.group(2), htmllib.unescape(m.group(1))


def week_block(html: str, pk: int) -> str:
    """Return the week picture fragment of a page, from its root to its end."""
    start = html.index(f'<div class="week-picture" id="served-model-{pk}-week"')
    end = (
        html.index("</ol>", start)
        if "week-legend" in html[start:]
        else html.index("</table>", start)
    )
    return html[start:end]


@pytest.fixture
def stored(db: Any) -> ServedModel:
    """A CPU model (min 0, max 1) with one weekday window: 2 replicas 08:00 to 18:00."""
    store(
        cpu_model(
            "small",
            scaling={
                "min": 0,
                "max": 1,
                "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2}],
            },
        )
    )
    return ServedModel.objects.get(name="small")


def draft(client: Any, **values: str) -> dict[str, str]:
    data = scrape(client.get(page_url()).content.decode())
    data.update(values)
    return data


def add_row(data: dict[str, str], **values: str) -> dict[str, str]:
    """Return the post with one more window row, as the page's Add button makes it."""
    n = int(data["windows-TOTAL_FORMS"])
    data = {**data, "windows-TOTAL_FORMS": str(n + 1)}
    row = {"days": "", "from_time": "", "to_time": "", "min": "", "max": "", "id": "", "model": ""}
    row.update(values)
    data.update({f"windows-{n}-{k}": v for k, v in row.items()})
    return data


# The page


def test_editor_shows_windows_scaling_and_the_week(
    client_for: Any, operator: Any, stored: Any
) -> None:
    r = client_for(operator).get(page_url())
    assert r.status_code == 200
    html = r.content.decode()
    data = scrape(html)
    assert (data["windows-0-days"], data["windows-0-from_time"], data["windows-0-to_time"]) == (
        "weekdays",
        "08:00",
        "18:00",
    )
    assert (data["scaling_min"], data["scaling_max"], data["scaling_prewarm"]) == ("0", "1", "")
    assert cell(html, "Mon", 9) == ("2", "Mon 09:00 — min 2, max 2 (window 0)")
    assert cell(html, "Sat", 9)[0] == "0"
    assert "+ Add a window" in html
    # The same fragment as the model's page, from the same function.
    detail = client_for(operator).get(reverse("catalog:servedmodel_detail", args=["small"]))
    assert week_block(detail.content.decode(), stored.pk) == week_block(html, stored.pk)


def test_editor_partial_for_htmx(client_for: Any, operator: Any, stored: Any) -> None:
    html = client_for(operator).get(page_url(), **HX).content.decode()
    assert "<html" not in html
    assert html.lstrip().startswith('<form id="schedule-form"')
    assert f'id="served-model-{stored.pk}-week"' in html


def test_model_page_links_to_the_editor_for_operators_only(
    client_for: Any, operator: Any, viewer: Any, stored: Any
) -> None:
    detail = reverse("catalog:servedmodel_detail", args=["small"])
    assert page_url() in client_for(operator).get(detail).content.decode()
    assert page_url() not in client_for(viewer).get(detail).content.decode()


def test_viewer_gets_403_and_changes_nothing(
    client_for: Any, operator: Any, viewer: Any, stored: Any
) -> None:
    data = draft(client_for(operator), **{"windows-0-min": "5"})
    c = client_for(viewer)
    assert c.get(page_url()).status_code == 403
    assert c.post(page_url(), data).status_code == 403
    assert c.post(check_url(), data).status_code == 403
    assert stored.windows.get().min == 2
    assert not ChangeRecord.objects.filter(action="update").exists()


def test_signed_out_is_sent_to_sign_in(client: Any, stored: Any) -> None:
    r = client.get(page_url())
    assert r.status_code == 302 and r["Location"].startswith("/login/")


def test_unknown_model_is_404(client_for: Any, operator: Any) -> None:
    assert client_for(operator).get(page_url("nope")).status_code == 404


# The live check


@pytest.mark.parametrize(
    ("field", "value", "slot", "message"),
    [
        ("windows-0-from_time", "25:00", "windows-0-from_time", BAD_FROM),
        (
            "windows-0-to_time",
            "8am",
            "windows-0-to_time",
            'scaling.schedule[0]: to "8am" is not HH:MM, like 08:00',
        ),
        (
            "windows-0-days",
            "mon, someday",
            "windows-0-days",
            'scaling.schedule[0]: day "someday" is not mon … sun, weekdays or weekends',
        ),
        (
            "windows-0-max",
            "1",
            "windows-0-max",
            "scaling.schedule[0]: min 2 and max 1: min is 0 or more, and max is 0 "
            "(the model's own) or at least min",
        ),
        (
            "windows-0-to_time",
            "08:00",
            "windows-0-to_time",
            "scaling.schedule[0]: from and to are the same time (08:00): give the window a "
            "length (a to before from runs past midnight)",
        ),
        (
            "scaling_max",
            "-1",
            "scaling_max",
            "scaling max -1 is below min 0: raise max or lower min",
        ),
        (
            "scaling_prewarm",
            "13h",
            "scaling_prewarm",
            "scaling.prewarm 13h is not between 0 and 12h",
        ),
    ],
)
def test_check_puts_the_rules_message_at_the_field_and_saves_nothing(
    client_for: Any, operator: Any, stored: Any, field: str, value: str, slot: str, message: str
) -> None:
    c = client_for(operator)
    data = draft(c, **{field: value, "_touched": field})
    r = c.post(check_url(), data, **HX)
    assert r.status_code == 200
    html = r.content.decode()
    assert error_at(html, slot) == message
    assert "1 problem to fix." in html
    # Saving nothing.
    assert stored.windows.get().from_time == "08:00"
    assert ServedModel.objects.get(pk=stored.pk).scaling_max == 1
    assert ChangeRecord.objects.count() == 1  # the fixture's creation


def test_a_duration_without_unit_is_refused_at_the_field(
    client_for: Any, operator: Any, stored: Any
) -> None:
    c = client_for(operator)
    html = c.post(
        check_url(), draft(c, scaling_prewarm="20", _touched="scaling_prewarm")
    ).content.decode()
    assert "unit" in error_at(html, "scaling_prewarm")


def test_errors_of_fields_not_touched_wait(client_for: Any, operator: Any, stored: Any) -> None:
    c = client_for(operator)
    data = draft(c, **{"windows-0-from_time": "25:00", "_touched": "windows-0-min"})
    html = c.post(check_url(), data).content.decode()
    assert error_at(html, "windows-0-from_time") == ""
    assert "1 more in fields not filled in yet" in html
    # "*" (after a Save) shows them all.
    html = c.post(check_url(), {**data, "_touched": "*"}).content.decode()
    assert error_at(html, "windows-0-from_time") == BAD_FROM


def test_check_redraws_the_week_from_the_draft(client_for: Any, operator: Any, stored: Any) -> None:
    c = client_for(operator)
    data = add_row(
        draft(c, **{"windows-0-min": "3"}), days="sat", from_time="22:00", to_time="02:00", min="1"
    )
    html = c.post(check_url(), {**data, "_touched": "*"}, **HX).content.decode()
    assert f'id="served-model-{stored.pk}-week" hx-swap-oob="true"' in html
    assert cell(html, "Mon", 9)[0] == "3"
    assert cell(html, "Sat", 23) == ("1", "Sat 23:00 — min 1, max 1 (window 1)")
    assert cell(html, "Sun", 1)[0] == "1" and cell(html, "Sun", 2)[0] == "0"
    assert "No problems" in html
    # Nothing saved.
    assert [w.min for w in stored.windows.all()] == [2]


def test_a_window_with_errors_is_left_out_of_the_picture(
    client_for: Any, operator: Any, stored: Any
) -> None:
    c = client_for(operator)
    data = add_row(draft(c), days="sun", from_time="8am", to_time="12:00", min="1")
    html = c.post(check_url(), {**data, "_touched": "*"}).content.decode()
    assert error_at(html, "windows-1-from_time") == (
        'scaling.schedule[1]: from "8am" is not HH:MM, like 08:00'
    )
    # Window 1 is not drawn (no cell says so); window 0 still is.
    assert "(window 1)" not in html
    assert cell(html, "Sun", 10)[0] == "0" and cell(html, "Mon", 9)[0] == "2"
    assert "not drawn: fix its errors first" in html


def test_a_row_with_a_shape_error_is_left_out_while_the_others_are_drawn(
    client_for: Any, operator: Any, stored: Any
) -> None:
    c = client_for(operator)
    data = add_row(
        draft(c, **{"windows-0-min": "x"}), days="sun", from_time="25:00", to_time="12:00", min="1"
    )
    html = c.post(check_url(), {**data, "_touched": "*"}).content.decode()
    assert error_at(html, "windows-0-min") == "Enter a whole number."
    # The rules did not run (a shape error stops them), but the picture still leaves
    # out the window they would refuse.
    assert "(window 1)" not in html and "(window 0)" not in html


def test_a_covered_window_is_pointed_out(client_for: Any, operator: Any, stored: Any) -> None:
    c = client_for(operator)
    data = add_row(draft(c), days="mon", from_time="09:00", to_time="10:00", min="4")
    html = c.post(check_url(), {**data, "_touched": "*"}).content.decode()
    assert "never in force: earlier windows hold whenever it would" in html
    assert cell(html, "Mon", 9)[0] == "2"


def test_an_empty_day_list_is_every_day(client_for: Any, operator: Any, stored: Any) -> None:
    c = client_for(operator)
    data = draft(c, **{"windows-0-days": "", "_touched": "*"})
    html = c.post(check_url(), data).content.decode()
    assert error_at(html, "windows-0-days") == ""
    assert cell(html, "Sun", 9)[0] == "2"
    assert re.search(r"window 0</span>\s+every day 08:00–18:00, min 2", html)


def test_check_of_a_model_gone_says_so(client_for: Any, operator: Any, stored: Any) -> None:
    c = client_for(operator)
    data = draft(c)
    ServedModel.objects.filter(pk=stored.pk).delete()
    html = c.post(check_url(), data).content.decode()
    assert error_at(html, "__all__") == 'model "small" is no longer in the catalog'


# Save


def test_save_writes_through_the_service_and_logs_who(
    client_for: Any, operator: Any, stored: Any
) -> None:
    c = client_for(operator)
    data = add_row(
        draft(c, scaling_prewarm="20m"),
        days="sat, sun",
        from_time="10:00",
        to_time="16:00",
        min="1",
    )
    r = c.post(page_url(), data, **HX)
    assert r.status_code == 200
    assert r["HX-Redirect"] == reverse("catalog:servedmodel_detail", args=["small"])
    m = ServedModel.objects.get(pk=stored.pk).to_spec()
    assert m.scaling.prewarm == 20 * 60 * 10**9
    assert [(w.days, w.from_, w.to, w.min) for w in m.scaling.schedule] == [
        (["weekdays"], "08:00", "18:00", 2),
        (["sat", "sun"], "10:00", "16:00", 1),
    ]
    # Everything else as it was.
    assert [p.name for p in m.profiles] == ["cpu"] and m.source == "/models/small.gguf"
    record = ChangeRecord.objects.latest("id")
    assert (record.action, record.surface, record.actor_name, record.summary) == (
        "update",
        "console",
        "otto",
        "scaling",
    )
    # Without htmx: a plain redirect.
    r = c.post(page_url(), draft(c, scaling_max="2"))
    assert r.status_code == 302 and ServedModel.objects.get(pk=stored.pk).scaling_max == 2


def test_save_with_a_bad_time_shows_every_error_and_saves_nothing(
    client_for: Any, operator: Any, stored: Any
) -> None:
    c = client_for(operator)
    r = c.post(page_url(), draft(c, **{"windows-0-from_time": "25:00"}), **HX)
    assert r.status_code == 200 and "HX-Redirect" not in r
    html = r.content.decode()
    assert error_at(html, "windows-0-from_time") == BAD_FROM
    assert 'name="_touched" value="*"' in html
    assert "1 problem to fix." in html
    assert stored.windows.get().from_time == "08:00"
    assert ChangeRecord.objects.count() == 1


def test_save_removes_a_window_ticked_for_deletion(
    client_for: Any, operator: Any, stored: Any
) -> None:
    c = client_for(operator)
    r = c.post(page_url(), draft(c, **{"windows-0-DELETE": "on", "windows-0-from_time": "25:00"}))
    assert r.status_code == 302
    assert not stored.windows.exists()


@pytest.mark.parametrize(
    ("console", "window", "path", "slot", "code"),
    [
        (
            {"windows-0-from_time": "25:00"},
            {"from": "25:00"},
            "scaling.schedule[0].from",
            "windows-0-from_time",
            "bad_clock",
        ),
        (
            {"windows-0-to_time": "8am"},
            {"to": "8am"},
            "scaling.schedule[0].to",
            "windows-0-to_time",
            "bad_clock",
        ),
        (
            {"windows-0-max": "1"},
            {"max": 1},
            "scaling.schedule[0].max",
            "windows-0-max",
            "bad_window_range",
        ),
        (
            {"windows-0-days": "someday"},
            {"days": ["someday"]},
            "scaling.schedule[0].days[0]",
            "windows-0-days",
            "bad_day",
        ),
    ],
)
def test_the_api_refuses_the_same_input_with_the_same_message_at_the_same_path(
    client_for: Any,
    api_for: Any,
    operator: Any,
    stored: Any,
    console: dict[str, str],
    window: dict[str, Any],
    path: str,
    slot: str,
    code: str,
) -> None:
    c = client_for(operator)
    answer = c.post(check_url(), draft(c, **console, _touched="*")).content.decode()
    body = {"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 2, **window}
    api = api_for(operator).patch(
        reverse("servedmodel-detail", args=["small"]),
        {"scaling": {"schedule": [body]}},
        format="json",
    )
    assert api.status_code == 400
    [error] = api.json()["errors"]
    assert (error["field"], error["code"]) == (path, code)
    assert error["message"] == error_at(answer, slot)
    assert stored.windows.get().from_time == "08:00"
    assert ChangeRecord.objects.count() == 1
