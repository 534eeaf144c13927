"""Smaller security holes: each through the surface it was met at.

- the embedded database and the data folder are private to the user running llmgw;
- a ``limit`` or ``offset`` no database integer holds gives a page, not a 500;
- the OpenAPI schema is for signed-in users and API tokens, as the docs page is;
- every page carries a Content-Security-Policy and runs no inline script or style, and
  pages still work under it in Chromium; HSTS behind ``LLMGW_TLS_PROXY``;
"""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _embedded_env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
    env |= {"LLMGW_DATA_DIR": str(data), "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings"}
    return env


def _manage(data: Path, *args: str) -> None:
    out = subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=_embedded_env(data),
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.umask(0o022),  # the usual umask: files 644, folders 755
    )
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_embedded_database_and_data_folder_are_private(tmp_path: Path) -> None:
    data = tmp_path / "var"
    _manage(data, "migrate", "--noinput")
    assert _mode(data) == 0o700
    files = [p for p in data.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"llmgw.sqlite3", "secret_key"}
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}


def test_an_install_made_before_is_made_private_at_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "var"
    _manage(data, "migrate", "--noinput")
    data.chmod(0o755)
    (data / "llmgw.sqlite3").chmod(0o644)
    _manage(data, "check")
    assert _mode(data) == 0o700
    assert _mode(data / "llmgw.sqlite3") == 0o600


# --- The API's pages ---------------------------------------------------------------

HUGE = "18446744073709551617"  # 2**64 + 1: no database integer holds it


def _schema(api: Any) -> dict[str, Any]:
    r = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert r.status_code == 200, r.content[:300]
    return json.loads(r.content)


def _list_paths(schema: dict[str, Any]) -> list[str]:
    return sorted(
        path
        for path, ops in schema["paths"].items()
        if "{" not in path
        and "get" in ops
        and any(p["name"] == "limit" for p in ops["get"].get("parameters", []))
    )


def _a_row_in_every_list(admin_user: Any) -> None:
    from cluster import reconciler
    from cluster.models import ClusterAction, FacilityBudget, JoinToken
    from llmgw_core.models import ApiToken
    from tests.catalog.samples import gpu_model, store
    from tests.cluster.helpers import join_node

    store(gpu_model("chat"))  # a model and its change record
    join_node("gpu-1", ["nvidia-h100-80gb"] * 2)  # a node, its cards
    reconciler.tick()  # the model's replica
    FacilityBudget.objects.create(level="rack", name="r1", cap_watts=5000)
    JoinToken.issue("spare")
    ApiToken.issue(admin_user, "ci")
    ClusterAction.objects.create(actor_name="ada", action="cordon", target="gpu-1")
    from cluster import tenancy

    tenancy.set_quota("team:search", cards={"nvidia-h100-80gb": 2}, via="test")
    from django.utils import timezone

    from gateway.models import ClientKey, Peer, Refusal, Usage

    ClientKey.objects.create(name="k1", prefix="llmgw_k1", digest="0" * 64)
    Usage.objects.create(minute=timezone.now().replace(second=0, microsecond=0), key="k1")
    Refusal.objects.create(at=timezone.now(), request_id="req_1", direction="request", key="k1")
    Peer.objects.create(name="east", url="https://east.example", api_key_file="east")


@pytest.mark.django_db
def test_a_huge_limit_or_offset_is_a_page_not_a_500(api_for: Any, admin_user: Any) -> None:
    api = api_for(admin_user)
    _a_row_in_every_list(admin_user)
    paths = _list_paths(_schema(api))
    assert len(paths) >= 7, paths
    for path in paths:
        # A full page with a row, so the database is asked for rows (an empty table is
        # answered without).
        assert api.get(path).json()["count"] >= 1, path
        for query in (f"limit={HUGE}", f"offset={HUGE}", f"limit={HUGE}&offset={HUGE}"):
            r = api.get(f"{path}?{query}")
            assert r.status_code == 200, (path, query, r.status_code, r.content[:200])
            body = r.json()
            assert isinstance(body["results"], list), (path, query)


# --- The schema --------------------------------------------------------------------


@pytest.mark.django_db
def test_the_api_schema_needs_a_signed_in_user_or_a_token(make_user: Any, client_for: Any) -> None:
    from django.test import Client

    from llmgw_core.models import ApiToken

    anonymous = Client().get("/api/schema/")
    assert anonymous.status_code in (401, 403), anonymous.status_code
    assert b"openapi" not in anonymous.content
    # As the docs page: a viewer reads it, by session or by API token.
    viewer = make_user("vera", "viewer")
    assert client_for(viewer).get("/api/schema/").status_code == 200
    _, secret = ApiToken.issue(viewer, "ci")
    r = Client().get("/api/schema/", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert r.status_code == 200 and b"openapi" in r.content
    # A signed-in user with no role reads neither.
    assert client_for(make_user("olga", None)).get("/api/schema/").status_code == 403
    assert Client().get("/api/docs/").status_code == 302  # to the sign-in page


# --- Content-Security-Policy and HSTS ----------------------------------------------

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.I)
INLINE_STYLE = re.compile(r"<style\b|\sstyle=", re.I)


def _console_pages() -> list[str]:
    return [
        "/login/",
        "/cluster/",
        "/catalog/",
        "/catalog/new/",
        "/catalog/models/chat/",
        "/catalog/models/chat/edit/",
        "/catalog/models/chat/schedule/",
        "/guard/",
        "/guard/evals/",
        "/api/docs/",
        "/gateway/keys/",
        "/gateway/chat/",
        "/gateway/traffic/",
        "/admin/",
        "/admin/catalog/servedmodel/",
        "/admin/catalog/servedmodel/add/",
        "/admin/guard/guardpolicy/",
        "/admin/auth/user/",
    ]


@pytest.mark.django_db
def test_every_page_has_a_content_security_policy_and_no_inline_script(
    admin_user: Any, client_for: Any
) -> None:
    from llmgw_core.security import CONTENT_SECURITY_POLICY
    from tests.catalog.samples import gpu_model, store

    store(gpu_model("chat"))
    c = client_for(admin_user)
    assert "script-src 'self'" in CONTENT_SECURITY_POLICY
    assert "unsafe" not in CONTENT_SECURITY_POLICY
    for path in _console_pages():
        r = c.get(path, follow=True)
        assert r.status_code == 200, (path, r.status_code)
        assert r.headers.get("Content-Security-Policy") == CONTENT_SECURITY_POLICY, path
        html = r.content.decode()
        assert not INLINE_SCRIPT.search(html), (path, INLINE_SCRIPT.search(html))
        assert not INLINE_STYLE.search(html), (
            path,
            html[INLINE_STYLE.search(html).start() :][:200],
        )
    # The API answers carry it too (a browser opening a JSON answer).
    assert "Content-Security-Policy" in c.get("/api/v1/catalog/models/").headers


# Every violation the page reports, kept by a script Playwright adds before the page's own.
CSP_WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", (e) => {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " " + e.sourceFile);
});
"""


@pytest.mark.browser
def test_pages_work_in_chromium_under_the_policy(
    browser: Any, live_server: Any, admin_user: Any
) -> None:
    from tests.browser.conftest import PASSWORD
    from tests.catalog.samples import gpu_model, store

    store(gpu_model("chat"))
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    try:
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.add_init_script(CSP_WATCH)
        page.goto(f"{live_server.url}/login/")
        page.fill("#id_username", admin_user.username)
        page.fill("#id_password", PASSWORD)
        page.click("button[type=submit]")
        page.wait_for_url(f"{live_server.url}/cluster/")
        seen: dict[str, list[str]] = {}
        for path in _console_pages()[1:]:
            page.goto(f"{live_server.url}{path}")
            page.wait_for_load_state("networkidle")
            seen[path] = page.evaluate("window.__csp")
        # The docs page's script ran: Swagger UI drew the API's title from the schema.
        page.goto(f"{live_server.url}/api/docs/")
        page.wait_for_selector(".swagger-ui .info .title")
        assert "llmgw API" in page.inner_text(".swagger-ui .info .title")
        # htmx runs: the catalog list's search swaps in its rows.
        page.goto(f"{live_server.url}/catalog/")
        page.fill("input[name=search]", "chat")
        page.wait_for_selector("text=chat")
        seen["/catalog/ (search)"] = page.evaluate("window.__csp")
        assert {p: v for p, v in seen.items() if v} == {}
    finally:
        context.close()


def test_hsts_behind_the_tls_proxy_only(
    transactional_db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real web process (as production runs it): HTTPS answers behind the proxy
    carry Strict-Transport-Security; without LLMGW_TLS_PROXY, or over plain HTTP, none."""
    import httpx

    from llmgw_core.security import CONTENT_SECURITY_POLICY
    from tests.e2e.test_web_process import WebProcess

    monkeypatch.setenv("LLMGW_SIMULATE", "off")
    https = {"X-Forwarded-Proto": "https"}
    for name, extra in (("plain", {}), ("proxy", {"LLMGW_TLS_PROXY": "true"})):
        (tmp_path / name).mkdir()
        web = WebProcess(tmp_path / name, extra=extra)
        web.start()
        try:
            secure = httpx.get(web.url + "/login/", headers=https)
            plain = httpx.get(web.url + "/login/")
        finally:
            web.stop()
        assert secure.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert "strict-transport-security" not in plain.headers, name
        if name == "proxy":
            assert secure.headers["strict-transport-security"] == "max-age=31536000"
        else:
            assert "strict-transport-security" not in secure.headers


# --- guard eval --set FILE -----------------------------------------------------------

NOT_SETS = {
    "shadow": "root:$6$SECRET-HASH-1$abcdef:20228:0:99999:7:::\ndaemon:*:20228:0:99999:7:::\n",
    ".env": "DB_PASSWORD=SECRET-PW-2\nAPI_KEY=SECRET-KEY-3\n",
    "config.toml": '[database]\npassword = "SECRET-PW-4"\n',
    "settings.yaml": "database:\n  password: SECRET-PW-5\nname: prod\n",
    "list.yaml": "- SECRET-ITEM-6\n- SECRET-ITEM-7\n",
}


@pytest.mark.django_db
@pytest.mark.parametrize("name", sorted(NOT_SETS))
def test_guard_eval_shows_nothing_of_a_file_that_is_not_a_set(tmp_path: Path, name: str) -> None:
    from django.core.management import CommandError, call_command

    path = tmp_path / name
    path.write_text(NOT_SETS[name])
    with pytest.raises(CommandError) as refused:
        call_command("guard", "eval", "--set", str(path))
    message = str(refused.value).replace(str(path), "FILE")
    assert "FILE is not a labelled set" in message and "nothing of it is shown" in message
    assert (
        not {"SECRET", "root", "daemon", "password", "DB_", "database"}
        & set(re.findall(r"[A-Za-z_]+", message))
        and "SECRET" not in message
    ), message


@pytest.mark.django_db
@pytest.mark.parametrize("target", ["/dev/zero", "folder"])
def test_guard_eval_refuses_what_is_not_a_file(tmp_path: Path, target: str) -> None:
    from django.core.management import CommandError, call_command

    path = tmp_path if target == "folder" else Path(target)
    with pytest.raises(CommandError, match="cannot read .*: not a file"):
        call_command("guard", "eval", "--set", str(path))


@pytest.mark.django_db
def test_guard_eval_still_says_what_is_wrong_in_a_set(tmp_path: Path) -> None:
    from django.core.management import CommandError, call_command

    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\ntexts:\n  - text: continue\n    label: bogus\n")
    with pytest.raises(CommandError, match=r'texts\[0\]\.label \(line 4\): label "bogus"'):
        call_command("guard", "eval", "--set", str(path))
    # A set with a YAML mistake is a set too: the reader's message says where.
    path.write_text("name: mine\ntexts:\n  - text: continue\n   label: ordinary\n")
    with pytest.raises(CommandError, match="line 4"):
        call_command("guard", "eval", "--set", str(path))


# --- PUT /api/v1/guard/policy ---------------------------------------------------------

FULL_POLICY = {
    "judge": {"models": ["qwen3guard-0.6b"], "controversial": "unsafe"},
    "fail": "closed",
    "directions": ["requests"],
    "categories": ["Violent"],
}


@pytest.mark.django_db
def test_a_put_of_part_of_the_policy_is_refused_and_patch_changes_only_what_it_gives(
    api_for: Any, operator: Any
) -> None:
    from guard import services
    from guard.models import PolicyChange

    api = api_for(operator)
    assert api.put("/api/v1/guard/policy", FULL_POLICY, format="json").status_code == 200
    before = api.get("/api/v1/guard/policy").json()
    assert before == FULL_POLICY
    logged = PolicyChange.objects.count()

    for body in ({}, {"fail": "open"}, {"judge": {"models": ["qwen3guard-0.6b"]}}):
        r = api.put("/api/v1/guard/policy", body, format="json")
        assert r.status_code == 400, (body, r.content)
        errors = r.json()["errors"]
        assert errors and all(e["code"] == "required" for e in errors), errors
        assert "PATCH" in errors[0]["message"]
        given = {".".join(k) for k in [("fail",)] if "fail" in body}
        assert {e["field"] for e in errors}.isdisjoint(given)
    assert {
        e["field"] for e in api.put("/api/v1/guard/policy", {}, format="json").json()["errors"]
    } == {
        "judge.models",
        "judge.controversial",
        "fail",
        "directions",
        "categories",
    }
    assert api.get("/api/v1/guard/policy").json() == before
    assert PolicyChange.objects.count() == logged

    r = api.patch("/api/v1/guard/policy", {"fail": "open"}, format="json")
    assert r.status_code == 200, r.content
    assert r.json() == {**FULL_POLICY, "fail": "open"}
    assert services.current_policy().refuse_categories == ("Violent",)
    r = api.patch("/api/v1/guard/policy", {"judge": {"controversial": "safe"}}, format="json")
    assert r.json()["judge"] == {"models": ["qwen3guard-0.6b"], "controversial": "safe"}
    r = api.patch("/api/v1/guard/policy", {"fail": "maybe"}, format="json")
    assert r.status_code == 400 and r.json()["errors"][0]["field"] == "fail"
    assert api.patch("/api/v1/guard/policy", [], format="json").status_code == 400
