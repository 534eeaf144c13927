"""The catalog console: pages, fragments, the live check, saving, deleting, reverting, roles."""

from __future__ import annotations

import html as htmllib
import re
from html.parser import HTMLParser
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from catalog import services, spec
from catalog.forms import ServedModelForm, file_key
from catalog.models import ChangeRecord, ServedModel
from catalog.problems import Problem
from catalog.schedule import week_grid
from catalog.views.form import SECTIONS
from catalog.views.pages import change_diff
from tests.catalog.samples import cpu_model, gpu_model, store

pytestmark = pytest.mark.django_db

LIST = reverse("catalog:servedmodel_list")
ADD = reverse("catalog:servedmodel_add")
VALIDATE = reverse("catalog:servedmodel_validate")
HX = {"HTTP_HX_REQUEST": "true"}
TP_MISMATCH = "2 nodes x 4 GPUs does not match tp 4 x pp 1"


class _FormScraper(HTMLParser):
    """Collect what a browser would post from the model form: inputs, textareas, selects."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, str] = {}
        self._inside = False
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "form" and a.get("id") == "served-model-form":
            self._inside = True
        if not self._inside or not a.get("name"):
            return
        name = a["name"] or ""
        if tag == "input":
            kind = a.get("type", "text")
            if kind == "checkbox":
                if "checked" in a:
                    self.data[name] = a.get("value") or "on"
            elif kind not in ("submit", "button"):
                self.data[name] = a.get("value") or ""
        elif tag == "textarea":
            self._textarea = name
            self.data[name] = ""
        elif tag == "select":
            self._select = name
            self.data.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in a:
            self.data[self._select] = a.get("value") or ""

    def handle_data(self, data: str) -> None:
        if self._textarea:
            # Django starts a textarea's content with a newline the browser drops.
            self.data[self._textarea] += data.removeprefix("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None
        elif tag == "form":
            self._inside = False


def scrape(html: str) -> dict[str, str]:
    """Return the values the model form on this page would post."""
    parser = _FormScraper()
    parser.feed(html)
    assert parser.data, "no model form on the page"
    return parser.data


def error_at(html: str, name: str) -> str:
    """Return the text of the error element of a field (empty when it has none)."""
    m = re.search(
        rf'<div class="field-errors" id="err-{re.escape(name)}"[^>]*>(.*?)</div>', html, re.S
    )
    assert m, f"no error element for {name}"
    return htmllib.unescape(re.sub(r"<[^>]+>", " ", m.group(1))).strip()


def new_model_data(client: Any, **values: str) -> dict[str, str]:
    """Return the new-model form's post: a vLLM model on two 4-card H100 nodes, tp 8."""
    data = scrape(client.get(ADD).content.decode())
    data.update(
        {
            "name": "chat",
            "source": "org/chat",
            "scaling_min": "1",
            "scaling_max": "2",
            "profiles-0-name": "h100",
            "profiles-0-engine": "vllm",
            "profiles-0-gpu_class": "nvidia-h100-80gb",
            "profiles-0-tp": "8",
            "profiles-0-nodes": "2",
            "profiles-0-gpus_per_node": "4",
        }
    )
    data.update(values)
    return data


def rich_model() -> dict[str, Any]:
    """Return a model that uses every block the detail page shows."""
    return gpu_model(
        "chat",
        description="General chat for the support team.",
        aliases=["chat-latest"],
        owner="team:ml",
        profiles=[
            {
                "name": "h100",
                "engine": "vllm",
                "engine_version": "0.6.3",
                "gpu_class": "nvidia-h100-80gb",
                "tp": 2,
                "args": ["--max-model-len", "8192"],
                "env": {"VLLM_LOGGING_LEVEL": "INFO"},
                "node_selector": {"llmgw.io/rack": "r1"},
                "startup_timeout": "25m",
                "min_memory_gb": 64,
            }
        ],
        scaling={
            "min": 1,
            "max": 4,
            "idle_timeout": "10m",
            "prewarm": "15m",
            "schedule": [{"days": ["weekdays"], "from": "08:00", "to": "18:00", "min": 3}],
        },
        adapters=[{"name": "chat-sql", "source": "/lora/sql"}],
        fallbacks=["small-latest"],
        canary={"model": "chat-next", "percent": 10},
        eval={"suite": "arithmetic", "min_score": 0.8},
        slo={"ttft_p99": "2s"},
        context_length=32768,
        max_output=4096,
        capabilities={"tools": True},
        origin={
            "repo": "org/chat",
            "revision": "0123456789abcdef",
            "files": [{"path": "model.safetensors", "sha256": "ab" * 32, "bytes": 1234}],
            "previous": {"source": "org/chat-old", "revision": "fedcba9876543210"},
        },
    )


def store_rich() -> None:
    store(cpu_model("small", aliases=["small-latest"]), gpu_model("chat-next"), rich_model())


# Pure helpers


def test_week_grid_reads_windows_hour_by_hour() -> None:
    scaling = spec.Scaling(
        min=1,
        max=4,
        schedule=[
            spec.ScaleWindow(days=["weekdays"], from_="08:00", to="18:00", min=3, max=0),
            spec.ScaleWindow(days=["fri"], from_="22:00", to="02:00", min=2, max=3),
        ],
    )
    grid = week_grid(scaling, ZoneInfo("Europe/Berlin"))
    assert [d.name for d in grid] == ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    assert all(len(d.cells) == 24 for d in grid)
    mon = grid[0].cells
    assert (mon[7].min, mon[7].max, mon[7].window) == (1, 4, None)
    # Window max 0 means the model's own max.
    assert (mon[8].min, mon[8].max, mon[8].window) == (3, 4, 0)
    assert mon[17].window == 0 and mon[18].window is None
    # A window past midnight holds on the next morning.
    sat = grid[5].cells
    assert (sat[1].min, sat[1].max, sat[1].window) == (2, 3, 1)
    assert sat[2].window is None and sat[10].min == 1
    assert grid[4].cells[23].window == 1
    assert mon[8].level == 4 and mon[7].level == 2


def test_week_grid_pulls_windows_forward_by_prewarm() -> None:
    window = spec.ScaleWindow(days=["mon"], from_="08:00", to="09:00", min=2)
    assert week_grid(spec.Scaling(min=0, max=2, schedule=[window]))[0].cells[7].min == 0
    warm = spec.Scaling(min=0, max=2, schedule=[window], prewarm=3_600_000_000_000)
    assert week_grid(warm)[0].cells[7].min == 2
    assert week_grid(spec.Scaling())[0].cells[0].level == 0


def test_change_diff_marks_added_and_removed_lines() -> None:
    lines = change_diff({"name": "a", "owner": "team:x"}, {"name": "a", "owner": "team:y"})
    assert ("del", "-owner: team:x") in lines and ("add", "+owner: team:y") in lines
    assert all(kind == "add" for kind, _ in change_diff(None, {"name": "a"}))


def test_file_keys_name_fields_as_the_file_does() -> None:
    assert file_key("scaling_min") == "scaling.min"
    assert file_key("origin_previous_source") == "origin.previous.source"
    assert file_key("capacity_class") == "class"
    assert file_key("from_time") == "from"
    assert file_key("gpus_per_node") == "gpus_per_node"


def test_form_sections_hold_every_field_once() -> None:
    names = [n for _, fields, _ in SECTIONS for n in fields]
    assert sorted(names) == sorted(ServedModelForm.base_fields)
    groups = [g for _, _, g in SECTIONS if g]
    assert sorted(groups) == ["adapters", "aliases", "origin_files", "profiles", "windows"]


# List


def test_list_full_page_and_htmx_partial(client_for: Any, viewer: Any) -> None:
    store(gpu_model("chat", aliases=["chat-latest"]), cpu_model("small"))
    c = client_for(viewer)
    full = c.get(LIST).content.decode()
    assert "<html" in full and 'id="served-model-table"' in full
    assert "chat-latest" in full and "nvidia-h100-80gb" in full and "llamacpp" in full
    part = c.get(LIST, **HX).content.decode()
    assert "<html" not in part and 'id="served-model-table"' in part
    assert "chat-latest" in part
    boosted = c.get(LIST, HTTP_HX_BOOSTED="true", **HX).content.decode()
    assert "<html" in boosted
    restoring = c.get(LIST, HTTP_HX_HISTORY_RESTORE_REQUEST="true", **HX).content.decode()
    assert "<html" in restoring


def test_list_filters(client_for: Any, viewer: Any) -> None:
    store(
        gpu_model("chat", owner="team:ml", description="General chat"),
        cpu_model("small"),
        gpu_model(
            "judge",
            role="guard",
            guard={"format": "llamaguard3"},
            scaling={"min": 1, "max": 1},
        ),
    )
    c = client_for(viewer)

    def names(query: str) -> list[str]:
        html = c.get(f"{LIST}?{query}", **HX).content.decode()
        return re.findall(r'<td class="name"><a href="[^"]+">([^<]+)</a>', html)

    assert names("") == ["chat", "small", "judge"]
    assert names("role=guard") == ["judge"]
    assert names("role=serve") == ["chat", "small"]
    assert names("class=critical") == ["judge"]
    assert names("class=opportunistic") == ["small"]
    assert names("engine=llamacpp") == ["small"]
    assert names("gpu_class=nvidia-h100-80gb") == ["chat", "judge"]
    assert names("owner=team:ml") == ["chat"]
    assert names("on_demand=true") == ["small"]
    assert names("on_demand=false") == ["chat", "judge"]
    assert names("search=general") == ["chat"]
    page = c.get(f"{LIST}?class=critical").content.decode()
    assert '<option value="critical" selected>' in page


def test_list_queries_do_not_grow_with_models(
    client_for: Any, viewer: Any, django_assert_max_num_queries: Any
) -> None:
    c = client_for(viewer)
    store(*[gpu_model(f"m{i}", aliases=[f"a{i}"]) for i in range(3)])
    with CaptureQueriesContext(connection) as few:
        assert c.get(LIST).status_code == 200
    store(*[gpu_model(f"n{i}", aliases=[f"b{i}"]) for i in range(27)])
    with django_assert_max_num_queries(len(few)):
        html = c.get(LIST).content.decode()
    assert html.count('<td class="name">') == 30


def store_many(count: int, **extra: Any) -> None:
    """Import ``count`` models m000, m001, … at once (one check, not one per save)."""
    from catalog import codec
    from catalog.choices import Surface

    models = []
    for i in range(count):
        m, problems = codec.decode_model(cpu_model(f"m{i:03d}", **extra))
        assert not problems, problems
        models.append(m)
    actor = services.Actor(user=None, surface=Surface.FILE, name="fixture")
    services.import_catalog(models, actor, replace=True)


def listed_names(html: str) -> list[str]:
    return re.findall(r'<td class="name"><a href="[^"]+">([^<]+)</a>', html)


def test_list_shows_a_page_of_100_with_the_total_and_links_that_keep_the_filters(
    client_for: Any, viewer: Any
) -> None:
    store_many(250)
    c = client_for(viewer)
    first = c.get(LIST).content.decode()
    assert listed_names(first) == [f"m{i:03d}" for i in range(100)]
    assert '250 models, <span data-role="range">1–100</span>' in first
    assert f'href="{LIST}?page=2"' in first and f'href="{LIST}?page=3"' in first
    assert 'aria-current="page">1<' in first and 'rel="prev"' not in first
    third = c.get(f"{LIST}?page=3", **HX).content.decode()
    assert listed_names(third) == [f"m{i:03d}" for i in range(200, 250)]
    assert "201–250" in third and 'rel="next"' not in third
    assert f'href="{LIST}?page=2" hx-get' in third  # previous
    # Past the last page: the last page.
    assert listed_names(c.get(f"{LIST}?page=9").content.decode())[0] == "m200"
    # A search that fits one page: its total, no page links.
    searched = c.get(f"{LIST}?search=m1").content.decode()
    assert listed_names(searched) == [f"m{i}" for i in range(100, 200)]
    assert "100 models match <span" in searched and 'data-role="pager"' not in searched


def test_list_page_links_keep_the_filter_and_search(client_for: Any, viewer: Any) -> None:
    store_many(250, owner="team:a")
    c = client_for(viewer)
    html = c.get(f"{LIST}?owner=team:a&search=m&page=2").content.decode()
    assert listed_names(html) == [f"m{i:03d}" for i in range(100, 200)]
    assert '250 models match, <span data-role="range">101–200</span>' in html
    assert f'href="{LIST}?owner=team%3Aa&amp;search=m&amp;page=3"' in html
    assert f'href="{LIST}?owner=team%3Aa&amp;search=m&amp;page=1"' in html
    # The live socket is for this page's rows: its URL carries the page with the filters.
    assert "view=catalog&amp;owner=team%3Aa&amp;search=m&amp;page=2" in html


def test_list_page_that_is_no_number_is_refused_saying_so(client_for: Any, viewer: Any) -> None:
    store_many(3)
    r = client_for(viewer).get(f"{LIST}?page=two")
    assert r.status_code == 400
    assert "&#x27;two&#x27; is no page number: write a whole number, 1 or more" in (
        r.content.decode()
    )
    assert listed_names(r.content.decode()) == []
    assert "No rows: the page asked for is no page" in r.content.decode()


def test_live_cells_are_pushed_for_the_pages_rows_only() -> None:
    from catalog.views.pages import listed_names as live_names

    store_many(250)
    assert live_names({"page": "2"}) == {f"m{i:03d}" for i in range(100, 200)}
    assert live_names({}) == {f"m{i:03d}" for i in range(100)}
    assert live_names({"page": "3", "search": "m24"}) == {f"m24{i}" for i in range(10)}
    assert live_names({"page": "x"}) == set()


# Detail


def test_detail_shows_the_whole_model(client_for: Any, viewer: Any) -> None:
    store_rich()
    html = (
        client_for(viewer)
        .get(reverse("catalog:servedmodel_detail", args=["chat"]))
        .content.decode()
    )
    for text in (
        "General chat for the support team.",
        "chat-latest",
        "team:ml",
        "nvidia-h100-80gb",
        "0.6.3",
        "--max-model-len",
        "VLLM_LOGGING_LEVEL=INFO",
        "llmgw.io/rack=r1",
        "25m",  # startup_timeout as a Go duration
        "10m",  # idle_timeout
        "15m",  # prewarm
        "2s",  # slo.ttft_p99
        "32768",
        "4096",
        "chat-sql",
        "arithmetic",
        "model.safetensors",
        "org/chat-old",
        "treated as <strong>standard</strong>",
    ):
        assert text in html, text
    # The profile's fingerprint: 16 hex digits.
    assert re.search(r'<th class="key">fingerprint</th>\s*<td><code>[0-9a-f]{16}</code>', html)
    assert re.search(r'<th class="key">startup_timeout</th>\s*<td>25m</td>', html)
    # Canary thresholds with the defaults filled in.
    assert 'min_requests</dt><dd>50 <span class="muted">(default)' in html
    # The fallback is an alias: the link goes to the model it means.
    assert (
        f'href="{reverse("catalog:servedmodel_detail", args=["small"])}">small-latest</a>' in html
    )
    # The week picture: 7 days of 24 hours, the weekday window at 3.
    week = html[html.index('-week">') :]
    week = week[: week.index("</table>")]
    assert week.count("<td ") == 7 * 24
    assert 'title="Mon 08:00 — min 3, max 4 (window 0)">3</td>' in week
    assert 'title="Sat 08:00 — min 1, max 4 (no window)">1</td>' in week
    # The change log.
    assert "fixture" in html and "created" in html


def test_detail_names_what_depends_on_the_model(client_for: Any, viewer: Any) -> None:
    store_rich()
    html = (
        client_for(viewer)
        .get(reverse("catalog:servedmodel_detail", args=["small"]))
        .content.decode()
    )
    assert "names it in its fallbacks" in html
    assert "Edit</a>" not in html and "Revert</button>" not in html


def test_a_name_with_a_slash_has_its_pages(client_for: Any, operator: Any) -> None:
    store(gpu_model("org/chat"))
    c = client_for(operator)
    detail = reverse("catalog:servedmodel_detail", args=["org/chat"])
    assert detail == "/catalog/models/org/chat/"
    assert "<h1>org/chat</h1>" in c.get(detail).content.decode()
    edit = reverse("catalog:servedmodel_edit", args=["org/chat"])
    assert scrape(c.get(edit).content.decode())["_replacing"] == "org/chat"
    assert c.get(reverse("catalog:servedmodel_delete", args=["org/chat"])).status_code == 200


def test_detail_partial_and_unknown_model(client_for: Any, viewer: Any) -> None:
    store(gpu_model("chat"))
    c = client_for(viewer)
    part = c.get(reverse("catalog:servedmodel_detail", args=["chat"]), **HX).content.decode()
    assert "<html" not in part and 'id="served-model-' in part
    assert c.get(reverse("catalog:servedmodel_detail", args=["nope"])).status_code == 404


# The live check


def test_validate_puts_the_rules_message_at_the_touched_field(
    client_for: Any, operator: Any
) -> None:
    c = client_for(operator)
    data = new_model_data(c, **{"profiles-0-tp": "4"})
    data["_touched"] = "name,source,profiles-0-tp"
    r = c.post(VALIDATE, data, **HX)
    assert r.status_code == 200
    html = r.content.decode()
    assert "<html" not in html
    assert TP_MISMATCH in error_at(html, "profiles-0-tp")
    assert 'id="err-profiles-0-tp" hx-swap-oob="true"' in html
    # Untouched fields and those without a problem are cleared.
    assert error_at(html, "name") == ""
    assert error_at(html, "profiles-0-gpus_per_node") == ""
    assert not ServedModel.objects.exists() and not ChangeRecord.objects.exists()


def test_validate_hides_untouched_fields_until_all_are_asked_for(
    client_for: Any, operator: Any
) -> None:
    c = client_for(operator)
    data = new_model_data(c, **{"profiles-0-tp": "4", "name": ""})
    data["_touched"] = "source"
    html = c.post(VALIDATE, data, **HX).content.decode()
    assert error_at(html, "profiles-0-tp") == "" and error_at(html, "name") == ""
    assert "2 more in fields not filled in yet" in html
    data["_touched"] = "*"
    html = c.post(VALIDATE, data, **HX).content.decode()
    assert TP_MISMATCH in error_at(html, "profiles-0-tp")
    assert "give it one" in error_at(html, "name")


def test_validate_clears_the_message_once_fixed(client_for: Any, operator: Any) -> None:
    c = client_for(operator)
    data = new_model_data(c)
    data["_touched"] = "profiles-0-tp"
    html = c.post(VALIDATE, data, **HX).content.decode()
    assert error_at(html, "profiles-0-tp") == ""
    assert "No problems" in html


def test_validate_shows_shape_errors_and_ignores_deleted_rows(
    client_for: Any, operator: Any
) -> None:
    c = client_for(operator)
    data = new_model_data(c, scaling_idle_timeout="90")
    data["_touched"] = "scaling_idle_timeout"
    html = c.post(VALIDATE, data, **HX).content.decode()
    assert "has no unit" in error_at(html, "scaling_idle_timeout")
    data = new_model_data(c, **{"profiles-0-tp": "4", "profiles-0-DELETE": "on"})
    data["_touched"] = "profiles-0-tp"
    html = c.post(VALIDATE, data, **HX).content.decode()
    assert error_at(html, "profiles-0-tp") == ""


def test_validate_checks_an_edit_against_the_model_it_replaces(
    client_for: Any, operator: Any
) -> None:
    store(gpu_model("chat", aliases=["chat-latest"]))
    c = client_for(operator)
    data = scrape(c.get(reverse("catalog:servedmodel_edit", args=["chat"])).content.decode())
    assert data["_replacing"] == "chat"
    data["_touched"] = "*"
    html = c.post(VALIDATE, data, **HX).content.decode()
    # Its own name and alias are not taken by another model.
    assert "No problems" in html


# Saving


def test_save_creates_the_model_and_logs_who(client_for: Any, operator: Any) -> None:
    c = client_for(operator)
    r = c.post(ADD, new_model_data(c), **HX)
    assert r.status_code == 200
    assert r["HX-Redirect"] == reverse("catalog:servedmodel_detail", args=["chat"])
    m = ServedModel.objects.get(name="chat").to_spec()
    assert (m.profiles[0].tp, m.profiles[0].nodes, m.profiles[0].gpus_per_node) == (8, 2, 4)
    assert m.scaling.min == 1
    record = ChangeRecord.objects.get()
    assert (record.action, record.surface, record.actor, record.actor_name) == (
        "create",
        "console",
        operator,
        "otto",
    )


def test_save_without_javascript_redirects(client_for: Any, operator: Any) -> None:
    c = client_for(operator)
    r = c.post(ADD, new_model_data(c))
    assert r.status_code == 302
    assert r["Location"] == reverse("catalog:servedmodel_detail", args=["chat"])


def test_bad_input_saves_nothing_and_shows_every_error(client_for: Any, operator: Any) -> None:
    c = client_for(operator)
    data = new_model_data(c, **{"profiles-0-tp": "4", "source": ""})
    r = c.post(ADD, data, **HX)
    assert r.status_code == 200
    html = r.content.decode()
    assert "<html" not in html and 'id="served-model-form"' in html
    assert TP_MISMATCH in error_at(html, "profiles-0-tp")
    assert "source is required" in error_at(html, "source")
    assert 'name="_touched" value="*"' in html
    assert not ServedModel.objects.exists() and not ChangeRecord.objects.exists()
    # Without JS: the whole page again, with the errors.
    page = c.post(ADD, data).content.decode()
    assert "<html" in page and TP_MISMATCH in error_at(page, "profiles-0-tp")


def test_a_refusal_at_save_shows_at_the_field(
    client_for: Any, operator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shows a refusal the service raises after the check passed (another change won)."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise services.Refused([Problem(("name",), 'model "chat" was added meanwhile', "taken")])

    monkeypatch.setattr(services, "save_model", refuse)
    c = client_for(operator)
    r = c.post(ADD, new_model_data(c), **HX)
    assert r.status_code == 200 and "HX-Redirect" not in r
    assert "was added meanwhile" in error_at(r.content.decode(), "name")


def test_edit_saves_in_place(client_for: Any, operator: Any) -> None:
    store(gpu_model("chat"))
    c = client_for(operator)
    url = reverse("catalog:servedmodel_edit", args=["chat"])
    data = scrape(c.get(url).content.decode())
    assert data["profiles-0-gpu_class"] == "nvidia-h100-80gb"
    data.update(
        {
            "description": "now described",
            "aliases-TOTAL_FORMS": "1",
            "aliases-0-name": "chat-latest",
        }
    )
    r = c.post(url, data, **HX)
    assert r["HX-Redirect"] == reverse("catalog:servedmodel_detail", args=["chat"])
    m = ServedModel.objects.get(name="chat").to_spec()
    assert m.description == "now described" and m.aliases == ["chat-latest"]
    assert len(m.profiles) == 1
    record = ChangeRecord.objects.filter(action="update").get()
    assert record.surface == "console" and "description" in record.summary


def test_rename_refused_while_another_model_falls_back_on_it(
    client_for: Any, operator: Any
) -> None:
    store(cpu_model("small"), gpu_model("chat", fallbacks=["small"]))
    c = client_for(operator)
    url = reverse("catalog:servedmodel_edit", args=["small"])
    data = scrape(c.get(url).content.decode())
    data["name"] = "tiny"
    html = c.post(url, data, **HX).content.decode()
    assert 'model "chat" names "small" in its fallbacks' in error_at(html, "name")
    assert ServedModel.objects.filter(name="small").exists()
    assert not ServedModel.objects.filter(name="tiny").exists()


def test_formrow_returns_a_blank_row_and_the_next_count(client_for: Any, operator: Any) -> None:
    c = client_for(operator)
    url = reverse("catalog:servedmodel_formrow", args=["profiles"])
    html = c.get(url, {"profiles-TOTAL_FORMS": "1"}, **HX).content.decode()
    assert 'id="profiles-1"' in html and 'name="profiles-1-gpu_class"' in html
    assert 'id="err-profiles-1-tp"' in html
    assert re.search(r'name="profiles-TOTAL_FORMS" value="2"[^>]*hx-swap-oob="true"', html)
    html = c.get(
        reverse("catalog:servedmodel_formrow", args=["aliases"]), {"aliases-TOTAL_FORMS": "0"}
    ).content.decode()
    assert html.lstrip().startswith("<tr") or '<tr id="aliases-0"' in html
    assert c.get(url, {"profiles-TOTAL_FORMS": "x"}).status_code == 400
    assert c.get(reverse("catalog:servedmodel_formrow", args=["nope"])).status_code == 404


# Deleting


def test_delete_confirmation_names_dependents_and_refuses(client_for: Any, operator: Any) -> None:
    store(cpu_model("small"), gpu_model("chat", fallbacks=["small"]))
    c = client_for(operator)
    url = reverse("catalog:servedmodel_delete", args=["small"])
    html = c.get(url).content.decode()
    assert "Deleting is refused" in html and "names it in its fallbacks" in html
    assert reverse("catalog:servedmodel_detail", args=["chat"]) in html
    assert "<button" not in html.split("<main", 1)[1]
    r = c.post(url)
    assert r.status_code == 200 and "Not deleted" in r.content.decode()
    assert ServedModel.objects.filter(name="small").exists()


def test_delete_removes_the_model(client_for: Any, operator: Any) -> None:
    store(cpu_model("small"))
    c = client_for(operator)
    url = reverse("catalog:servedmodel_delete", args=["small"])
    assert "Delete small</button>" in c.get(url).content.decode()
    r = c.post(url)
    assert r.status_code == 302 and r["Location"] == LIST
    assert not ServedModel.objects.exists()
    assert ChangeRecord.objects.filter(action="delete", surface="console").exists()


# Reverting


def test_revert_restores_the_before_side_in_place(client_for: Any, operator: Any) -> None:
    c = client_for(operator)
    c.post(ADD, new_model_data(c), **HX)
    url = reverse("catalog:servedmodel_edit", args=["chat"])
    data = scrape(c.get(url).content.decode())
    data["description"] = "changed"
    c.post(url, data, **HX)
    update = ChangeRecord.objects.get(action="update")
    obj = ServedModel.objects.get(name="chat")
    r = c.post(reverse("catalog:changerecord_revert", args=["chat", update.pk]), **HX)
    assert r.status_code == 200
    assert r["HX-Retarget"] == f"#served-model-{obj.pk}" and r["HX-Reswap"] == "outerHTML"
    html = r.content.decode()
    assert "<html" not in html and f'id="served-model-{obj.pk}"' in html
    assert "reverted" in html
    assert ServedModel.objects.get(name="chat").description == ""
    assert ChangeRecord.objects.filter(action="revert", reverts=update, surface="console").exists()


def test_revert_refused_shows_the_problems(client_for: Any, operator: Any) -> None:
    store(cpu_model("small"), gpu_model("chat", fallbacks=["small"]))
    created = ChangeRecord.objects.get(model_name="small", action="create")
    c = client_for(operator)
    url = reverse("catalog:changerecord_revert", args=["small", created.pk])
    html = c.post(url, **HX).content.decode()
    assert "Revert refused" in html and "chat" in html
    assert ServedModel.objects.filter(name="small").exists()
    page = c.post(url).content.decode()
    assert "<html" in page and "Revert refused" in page


def test_revert_of_a_creation_sends_the_browser_to_the_list(client_for: Any, operator: Any) -> None:
    store(cpu_model("small"))
    created = ChangeRecord.objects.get(action="create")
    c = client_for(operator)
    r = c.post(reverse("catalog:changerecord_revert", args=["small", created.pk]), **HX)
    assert r["HX-Redirect"] == LIST
    assert not ServedModel.objects.exists()


# Roles


def test_viewer_sees_no_controls_and_is_refused_every_change(client_for: Any, viewer: Any) -> None:
    store(gpu_model("chat"))
    record = ChangeRecord.objects.get()
    c = client_for(viewer)
    assert "New model" not in c.get(LIST).content.decode()
    detail = c.get(reverse("catalog:servedmodel_detail", args=["chat"])).content.decode()
    assert "Edit</a>" not in detail and "Delete</a>" not in detail and "Revert" not in detail
    change_urls = [
        ADD,
        reverse("catalog:servedmodel_edit", args=["chat"]),
        reverse("catalog:servedmodel_delete", args=["chat"]),
        VALIDATE,
        reverse("catalog:servedmodel_formrow", args=["profiles"]),
        reverse("catalog:changerecord_revert", args=["chat", record.pk]),
    ]
    for url in change_urls:
        for method in (c.get, c.post):
            r = method(url)
            assert r.status_code == 403, (method, url)
    page = c.get(ADD).content.decode()
    assert "this needs the operator role" in page.lower()
    assert ServedModel.objects.filter(name="chat").exists()
    assert ChangeRecord.objects.count() == 1


def test_operator_sees_the_controls(client_for: Any, operator: Any) -> None:
    store(gpu_model("chat"))
    c = client_for(operator)
    assert "New model" in c.get(LIST).content.decode()
    detail = c.get(reverse("catalog:servedmodel_detail", args=["chat"])).content.decode()
    assert "Edit</a>" in detail and "Revert</button>" in detail


def test_anonymous_users_are_sent_to_sign_in(client: Any) -> None:
    for url in (LIST, ADD, VALIDATE, reverse("catalog:servedmodel_detail", args=["chat"])):
        r = client.get(url)
        assert r.status_code == 302
        assert r["Location"].startswith("/login/?next=")
    page = client.get("/login/").content.decode()
    assert 'name="username"' in page and 'name="password"' in page


def test_pages_load_htmx_from_the_app_not_a_cdn(client_for: Any, admin_user: Any) -> None:
    html = client_for(admin_user).get(LIST).content.decode()
    assert "django_htmx/htmx-2" in html and "llmgw/console.js" in html
    assert not re.search(r'(src|href)="https?://', html)
    assert 'hx-headers=\'{"X-CSRFToken": "' in html
    assert 'href="/admin/"' in html and 'action="/logout/"' in html


def test_emptied_number_boxes_read_as_zero(operator):
    from catalog import forms as catalog_forms
    from tests.catalog.test_validation_matrix import post_data

    data = post_data(gpu_model_for_blank())
    data["context_length"] = ""
    data["profiles-0-priority"] = ""
    form = catalog_forms.ServedModelForm(data)
    formsets = catalog_forms.build_formsets(data, form.instance)
    model = catalog_forms.check_bundle(form, formsets, None)
    assert model is not None, form.errors
    assert model.context_length == 0 and model.profiles[0].priority == 0


def gpu_model_for_blank():
    from tests.catalog.samples import gpu_model

    return gpu_model("blank")
