"""Every admin action and view by role, through the real admin.

The registry is walked, not listed: every ModelAdmin in ``admin.site._registry``, every
action it has (Django's own ``delete_selected`` too) and every URL it serves (changelist,
add, change, delete, history and its own views, such as a user's password page), as a
viewer, an operator and an admin signed in with Django's test client. A viewer changes
nothing anywhere, and a refused action leaves the database as it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.core import checks
from django.test import Client
from django.utils import timezone

from llmgw_core.roles import ADMIN, OPERATOR, ROLES, VIEWER, RoleAdminMixin
from tests.updates.hubstandin import HubStandIn

# About 57 s for the file's 97 tests in a full run (load 2 to 10): listed with the
# long files, so that it starts early rather than end the run alone (tests/conftest.py).
pytestmark = [pytest.mark.django_db, pytest.mark.takes(0.6)]

REGISTRY = sorted(admin.site._registry.items(), key=lambda kv: kv[0]._meta.label)
APPS = ("catalog", "cluster", "guard", "llmgw_core", "llmgw_admin", "auth", "gateway", "updates")


def _actions(model_admin: Any) -> list[tuple[str, Any]]:
    return [(name, func) for func, name, _ in model_admin._get_base_actions()]


ACTIONS = [
    (model._meta.label, name)
    for model, model_admin in REGISTRY
    for name, _ in _actions(model_admin)
]


def allowed(model_admin: Any, func: Any, user: Any) -> bool:
    """Whether the user's role lets the action run: each permission it names, asked of
    the admin (a role by name, or the admin's role-based view/add/change/delete)."""
    request = _request(user)
    return model_admin.has_view_permission(request) and all(
        getattr(model_admin, f"has_{p}_permission")(request) for p in func.allowed_permissions
    )


def snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row of the project's tables (and users and groups), to compare."""
    out = {}
    for model in apps.get_models():
        if model._meta.app_label in APPS:
            rows = model._default_manager.order_by("pk").values()
            out[model._meta.label] = [
                {k: v for k, v in r.items() if k != "last_login"} for r in rows
            ]
    return out


@pytest.fixture
def rows(make_user: Any, settings: Any, tmp_path: Any) -> Iterator[dict[str, Any]]:
    """A row in every table the admin shows, so each change, delete and history page has
    one to show; the Hub stand-in holding the catalog model's repository (the updates
    app's actions on catalog models ask it)."""
    with HubStandIn() as hub:
        settings.HF_ENDPOINT = hub.url
        settings.LLMGW_MIRROR = True
        settings.LLMGW_MIRROR_HOSTS = [hub.url]
        settings.LLMGW_MIRROR_DIR = tmp_path / "mirror"
        settings.LLMGW_MIRROR_MAX_GB = 0
        settings.LLMGW_HF_TOKEN_FILE = ""
        hub.commit("org/chat", {"model.safetensors": b"w" * 100})
        hub.commit("org/solo", {"model.safetensors": b"s" * 100})
        yield _rows(make_user)


def _rows(make_user: Any) -> dict[str, Any]:
    from catalog.models import ServedModel
    from guard import services as guard_services
    from guard.models import EvalRun, JudgeHealth
    from llmgw_core.models import ApiToken
    from tests.catalog.samples import gpu_model, store
    from tests.cluster.helpers import join_node

    users = {role: make_user(f"{role}-1", role) for role in ROLES}
    store(
        gpu_model(
            "chat",
            aliases=["talk"],
            adapters=[{"name": "sql", "source": "org/sql-lora"}],
            scaling={"min": 1, "max": 2},
        )
    )
    guard_services.set_policy(
        {"judge": {"models": ["qwen3guard-0.6b"]}}, user=users[ADMIN], surface="cli"
    )
    JudgeHealth.objects.create(judge="qwen3guard-0.6b", answers=1)
    EvalRun.objects.create(
        started=timezone.now(),
        set_name="coding-ops",
        set_source="coding-ops",
        set_digest="0" * 64,
        actor_name="ada",
        surface="cli",
    )
    ApiToken.issue(users[ADMIN], "ci")
    join_node("gpu-1", ["nvidia-h100-80gb"])
    from gateway.services import create_key

    create_key("app", owner="team:tests", user=users[ADMIN])
    from gateway.models import Refusal, Usage

    Usage.objects.create(minute=timezone.now().replace(second=0, microsecond=0), key="app")
    Refusal.objects.create(at=timezone.now(), request_id="req_1", direction="request", key="app")
    from gateway.models import Peer

    Peer.objects.create(name="east", url="https://east.example", api_key_file="east")
    from updates.models import Fetch, UpdateCheck

    fetch = Fetch.objects.create(model="chat", source="org/chat", commit="c" * 40)
    UpdateCheck.objects.create(model="chat", state="current", checked=timezone.now())
    from updates.models import UpdateRun

    UpdateRun.objects.create(model="chat", state="failed", reason="cancelled by ada")
    # One running, at its canary (what promote and cancel act on); "solo" has none, so an
    # update of it starts.
    UpdateRun.objects.create(
        model="chat",
        state="running",
        step="canary",
        candidate="chat--update",
        commit="c" * 40,
        fetch_id=fetch.pk,
    )
    store(gpu_model("solo"))
    from cluster.models import Quota

    Quota.objects.create(owner="team:tests", cards={"nvidia-h100-80gb": 4})
    for model, _ in REGISTRY:
        assert model._default_manager.exists(), f"{model._meta.label}: add a row in rows()"
    assert ServedModel.objects.get(name="chat").scaling_max == 2
    return users


def signed_in(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def admin_urls(model: Any, model_admin: Any) -> list[tuple[str, str]]:
    """Every URL the admin serves for a model: (what, url), with its first row's key."""
    pk = str(model._default_manager.order_by("pk").first().pk)
    base = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    out = []
    for pattern in model_admin.get_urls():
        route = str(pattern.pattern)
        if route.endswith("$") or route.startswith("^"):
            route = route.strip("^$")
        url = base + re.sub(r"<[^>]+>", pk, route)
        out.append((pattern.name or route or "changelist", url))
    return out


class FormReader(HTMLParser):
    """The fields a change or add form would post, as a browser would send them."""

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self.select: str | None = None
        self.textarea: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        name = a.get("name")
        if tag == "input" and name:
            kind = a.get("type", "text")
            if kind in ("checkbox", "radio") and "checked" not in a:
                return
            if kind in ("submit", "button", "file"):
                return
            self.data.setdefault(name, []).append(a.get("value") or "")
        elif tag == "select" and name:
            self.select = name
            self.data.setdefault(name, [])
        elif tag == "option" and self.select and "selected" in a:
            self.data[self.select].append(a.get("value") or "")
        elif tag == "textarea" and name:
            self.textarea = name
            self.data[name] = [""]

    def handle_endtag(self, tag: str) -> None:
        if tag == "select":
            self.select = None
        elif tag == "textarea":
            self.textarea = None

    def handle_data(self, data: str) -> None:
        if self.textarea:
            self.data[self.textarea][-1] += data


def form_of(client: Client, url: str) -> dict[str, list[str]]:
    r = client.get(url)
    if r.status_code != 200:
        return {}
    reader = FormReader()
    reader.feed(r.content.decode())
    return reader.data


def test_every_admin_and_inline_asks_the_role() -> None:
    for model, model_admin in REGISTRY:
        assert isinstance(model_admin, RoleAdminMixin), model._meta.label
        for inline in model_admin.inlines:
            assert issubclass(inline, RoleAdminMixin), (model._meta.label, inline)
        for name, func in _actions(model_admin):
            assert getattr(func, "allowed_permissions", None), (model._meta.label, name)
    assert len(ACTIONS) >= 5, ACTIONS


def test_the_actions_other_apps_add_to_catalog_models_are_walked_like_its_own() -> None:
    """The updates app's bulk actions on catalog models (``catalog.extensions``) are in
    the catalog admin's actions, so the role test below runs each for every role."""
    from catalog import extensions

    assert extensions.ADMIN_ACTIONS
    for fn in extensions.ADMIN_ACTIONS:
        assert ("catalog.ServedModel", fn.__name__) in ACTIONS


def test_a_viewer_posting_an_action_another_app_added_is_refused(rows: dict[str, Any]) -> None:
    """The issue's case: a viewer's 'Update' on catalog models was answered 200 (the list
    again) where every other action is refused."""
    from catalog.models import ServedModel
    from updates.models import Fetch, UpdateRun

    solo = ServedModel.objects.get(name="solo")
    before = snapshot()
    for action in ("update_models", "check_for_updates"):
        r = signed_in(rows[VIEWER]).post(
            "/admin/catalog/servedmodel/",
            {"action": action, "_selected_action": [solo.pk], "index": "0"},
        )
        assert r.status_code == 403 and b"needs operator" in r.content, (action, r.status_code)
    assert snapshot() == before
    r = signed_in(rows[OPERATOR]).post(
        "/admin/catalog/servedmodel/",
        {"action": "update_models", "_selected_action": [solo.pk], "index": "0"},
    )
    assert r.status_code == 302
    assert UpdateRun.objects.filter(model="solo", state="running").count() == 1
    assert Fetch.objects.filter(model="solo").count() == 1


def test_manage_py_check_refuses_an_action_that_names_no_role() -> None:
    from catalog.admin import ServedModelAdmin
    from catalog.models import ServedModel

    assert [e for e in checks.run_checks() if e.id == "llmgw.E001"] == []

    class Careless(ServedModelAdmin):
        actions = ("nameless",)

        @admin.action(description="no role named")
        def nameless(self, request: Any, queryset: Any) -> None:
            queryset.update(scaling_max=0)

    site = admin.AdminSite(name="careless")
    careless = Careless(ServedModel, site)
    errors = [e for e in careless.check() if e.id == "llmgw.E001"]
    assert errors and "'nameless' names no role" in errors[0].msg


def test_a_viewer_reads_every_page_it_may_and_changes_nothing(rows: dict[str, Any]) -> None:
    viewer, boss = signed_in(rows[VIEWER]), signed_in(rows[ADMIN])
    before = snapshot()
    seen = []
    for model, model_admin in REGISTRY:
        viewer_may_read = model_admin.has_view_permission(_request(rows[VIEWER]))
        for what, url in admin_urls(model, model_admin):
            got = viewer.get(url)
            seen.append((what, url, got.status_code))
            assert got.status_code < 500, (url, got.status_code)
            if what.endswith(("_add", "_delete")) or "password" in what:
                assert got.status_code == 403, (url, got.status_code)
            elif what.endswith(("_changelist", "_change", "_history")):
                assert got.status_code == (200 if viewer_may_read else 403), (url, got.status_code)
            # What an admin's browser would post there, posted by the viewer.
            data = form_of(boss, url)
            data.update({"post": ["yes"], "_save": ["Save"]})
            posted = viewer.post(url, data)
            assert posted.status_code < 500, (url, posted.status_code)
            if what.endswith(("_add", "_change", "_delete")) or "password" in what:
                assert posted.status_code == 403, (url, posted.status_code)
            # The rest only read (a list, a history, a redirect to the change page): the
            # database is compared below.
    assert snapshot() == before
    assert {w for w, _, _ in seen} >= {"catalog_servedmodel_change", "auth_user_password_change"}


def _request(user: Any) -> Any:
    from django.test import RequestFactory

    r = RequestFactory().get("/admin/")
    r.user = user
    return r


ACTION_INPUTS = {"capacity_class": "opportunistic", "scaling_min": "0", "scaling_max": "0"}


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(("label", "action"), ACTIONS, ids=[f"{m}.{a}" for m, a in ACTIONS])
def test_every_action_runs_only_for_the_role_it_names(
    rows: dict[str, Any], label: str, action: str, role: str
) -> None:
    model = apps.get_model(label)
    model_admin = admin.site._registry[model]
    func = dict(_actions(model_admin))[action]
    user = rows[role]
    # An action an admin withdraws for everyone (get_actions drops it: a quota is deleted
    # one at a time, each logged) is offered to and run for no role.
    withdrawn = action not in model_admin.get_actions(_request(rows[ADMIN]))
    may = allowed(model_admin, func, user) and not withdrawn
    if role == VIEWER:
        assert not may, f"{label}.{action} is a viewer's"
    client = signed_in(user)
    url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    pks = [str(pk) for pk in model._default_manager.order_by("pk").values_list("pk", flat=True)]
    # Not the user's own row: an admin deleting the user it is signed in as would end the test.
    pks = [pk for pk in pks if not (model._meta.label == "auth.User" and pk == str(user.pk))]
    data = {"action": action, "_selected_action": pks, "index": "0", "post": "yes"}
    before = snapshot()
    offered = f'value="{action}"' in client.get(url).content.decode()
    r = client.post(url, data | ACTION_INPUTS)
    if may:
        assert offered, (label, action, role)
        assert r.status_code in (200, 302), (label, action, role, r.status_code)
        assert snapshot() != before, f"{label}.{action} as {role} changed nothing"
    else:
        assert not offered, (label, action, role)
        assert r.status_code == 403, (label, action, role, r.status_code)
        assert snapshot() == before, f"{label}.{action} as {role} changed the database"


def test_the_reported_bulk_edit_is_refused_to_a_viewer(rows: dict[str, Any]) -> None:
    """The issue's own case: a viewer posting set_min_max changed scaling.max."""
    from catalog.models import ChangeRecord, ServedModel

    chat = ServedModel.objects.get(name="chat")
    r = signed_in(rows[VIEWER]).post(
        "/admin/catalog/servedmodel/",
        {"action": "set_min_max", "_selected_action": [chat.pk], "index": "0", "scaling_max": "7"},
    )
    assert r.status_code == 403 and b"needs operator" in r.content
    assert ServedModel.objects.get(name="chat").scaling_max == 2
    assert not ChangeRecord.objects.filter(actor_name__contains="bulk action").exists()
    r = signed_in(rows[OPERATOR]).post(
        "/admin/catalog/servedmodel/",
        {"action": "set_min_max", "_selected_action": [chat.pk], "index": "0", "scaling_max": "3"},
    )
    assert r.status_code == 302
    assert ServedModel.objects.get(name="chat").scaling_max == 3


@pytest.mark.parametrize("role", [OPERATOR, ADMIN])
def test_operators_and_admins_open_what_their_role_allows(rows: dict[str, Any], role: str) -> None:
    user = rows[role]
    client = signed_in(user)
    before = snapshot()
    for model, model_admin in REGISTRY:
        request = _request(user)
        for what, url in admin_urls(model, model_admin):
            got = client.get(url)
            assert got.status_code < 500, (url, got.status_code)
            if what == "<path:object_id>/":  # only redirects to the change page
                assert got.status_code == 302, (url, role, got.status_code)
            elif not model_admin.has_view_permission(request):
                assert got.status_code == 403, (url, role, got.status_code)
            elif what.endswith("_add"):
                want = 200 if model_admin.has_add_permission(request) else 403
                assert got.status_code == want, (url, role, got.status_code)
            elif what.endswith("_delete"):
                want = 200 if model_admin.has_delete_permission(request) else 403
                assert got.status_code == want, (url, role, got.status_code)
            elif what.endswith(("_changelist", "_change", "_history")):
                assert got.status_code == 200, (url, role, got.status_code)
    assert snapshot() == before
    # The roles differ where they should: users and tokens are the admin's alone.
    users_page = client.get("/admin/auth/user/")
    assert users_page.status_code == (200 if role == ADMIN else 403)
    assert client.get("/admin/catalog/servedmodel/add/").status_code == 200


def test_an_admin_role_user_cannot_make_itself_a_superuser(make_user: Any) -> None:
    """Its own change page, posted as a browser would with superuser status ticked and a
    permission added: the user stays as it was (only a superuser grants those)."""
    from django.contrib.auth.models import Permission

    ada = make_user("ada", ADMIN)
    client = signed_in(ada)
    url = f"/admin/auth/user/{ada.pk}/change/"
    form = form_of(client, url)
    assert form, "the change page did not open"
    assert "is_superuser" not in form and "user_permissions" not in form
    perm = Permission.objects.get(codename="delete_user")
    form.update(is_superuser=["on"], user_permissions=[str(perm.pk)], _save=["Save"])
    r = client.post(url, form)
    assert r.status_code == 302, r.content.decode()[:2000]  # saved what it may change
    ada.refresh_from_db()
    assert not ada.is_superuser
    assert not ada.user_permissions.exists()


def test_a_superuser_still_grants_superuser_status(make_user: Any) -> None:
    root = make_user("root", ADMIN)
    root.is_superuser = True
    root.save()
    bob = make_user("bob", OPERATOR)
    client = signed_in(root)
    url = f"/admin/auth/user/{bob.pk}/change/"
    form = form_of(client, url)
    assert "is_superuser" not in form  # unticked: a checkbox not checked is not sent
    form.update(is_superuser=["on"], _save=["Save"])
    assert client.post(url, form).status_code == 302
    bob.refresh_from_db()
    assert bob.is_superuser


@pytest.mark.parametrize("role", ROLES)
def test_no_one_sees_a_client_keys_digest_in_the_admin(make_user: Any, role: str) -> None:
    from gateway import services

    key, _secret = services.create_key("probe", via="test")
    page = signed_in(make_user("someone", role)).get(f"/admin/gateway/clientkey/{key.pk}/change/")
    assert page.status_code == 200
    assert key.digest not in page.content.decode()
