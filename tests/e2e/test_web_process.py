"""The web process's server (uvicorn, llmgw_admin/server.py, what `manage.py serve`
runs): a stop asked for with SIGTERM ends it cleanly and writes what it held in memory.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from guard import services
from guard.models import JudgeHealth
from llmgw_core.models import ApiToken
from tests.browser.conftest import PASSWORD
from tests.e2e.conftest import ControlPlane
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop


class WebProcess(ControlPlane):
    """One of production's web processes: the server alone (``python -m
    llmgw_admin.server``, what ``serve`` runs), with no reconciler beside it (the
    judge's replica here has no node, which a reconciler would take away)."""

    def command(self) -> list[str]:
        return [sys.executable, "-m", "llmgw_admin.server", "--port", str(self.port)]


def test_sigterm_stops_the_web_process_cleanly_and_writes_the_last_counts(
    transactional_db: Any, tmp_path: Path, make_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    sim, url = launch("--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard")
    guard_model("qwen3guard-0.6b", endpoint=url)
    services.set_policy({"judge": {"models": ["qwen3guard-0.6b"]}}, surface="cli", name="t")
    token = ApiToken.issue(make_user("gateway", "viewer"), "gateway")[1]
    # Counts are written only at the stop: a minute between the recorder's writes.
    monkeypatch.setenv("LLMGW_GUARD_FLUSH_MS", "60000")
    monkeypatch.setenv("LLMGW_SIMULATE", "off")
    web = WebProcess(tmp_path)
    web.start()
    try:
        with httpx.Client(base_url=web.url, headers={"Authorization": f"Bearer {token}"}) as c:
            for text in ("how do I list files?", "how do I kill all child processes in bash"):
                r = c.post("/api/v1/guard/check", json={"request": text})
                assert r.status_code == 200 and r.json()["judge"] == "qwen3guard-0.6b", r.text
        assert not JudgeHealth.objects.filter(judge="qwen3guard-0.6b", answers__gt=0).exists()
        assert web.proc is not None
        web.proc.send_signal(signal.SIGTERM)
        assert web.proc.wait(timeout=20) == 0
    finally:
        web.stop()
        stop(sim)
    assert JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers == 2
    log = (tmp_path / "web-1.log").read_text()
    assert "Traceback" not in log, log


def _sign_in(web: ControlPlane, user: Any, headers: dict[str, str]) -> httpx.Response:
    """Post the login form as a browser at ``headers['Origin']`` would.

    The CSRF cookie is sent back by hand: a client keeps a cookie marked Secure for
    HTTPS, and the browser's side of the proxy is HTTPS while this side is not.
    """
    form = httpx.get(web.url + "/login/", headers=headers)
    token = form.cookies["csrftoken"]
    return httpx.post(
        web.url + "/login/",
        headers={**headers, "Cookie": f"csrftoken={token}"},
        data={"username": user.username, "password": PASSWORD, "csrfmiddlewaretoken": token},
    )


def test_behind_a_tls_proxy_forms_pass_and_cookies_go_over_https_only(
    transactional_db: Any, tmp_path: Path, make_user: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = make_user("tess", "viewer")
    monkeypatch.setenv("LLMGW_SIMULATE", "off")
    # What the proxy adds to every request a browser sent to https://llmgw.example.org.
    host = "127.0.0.1"
    proxied = {"X-Forwarded-Proto": "https"}

    plain = WebProcess(tmp_path / "plain")
    (tmp_path / "plain").mkdir()
    plain.start()
    try:
        # Without LLMGW_TLS_PROXY the process takes the request for http: the https origin
        # is refused, and the cookies would go over plain HTTP too.
        refused = _sign_in(plain, user, {**proxied, "Origin": f"https://{host}:{plain.port}"})
        assert refused.status_code == 403 and "CSRF verification failed" in refused.text
    finally:
        plain.stop()

    proxy = WebProcess(tmp_path / "proxy", extra={"LLMGW_TLS_PROXY": "true"})
    (tmp_path / "proxy").mkdir()
    proxy.start()
    try:
        r = _sign_in(proxy, user, {**proxied, "Origin": f"https://{host}:{proxy.port}"})
        assert r.status_code == 302, r.text
        cookies = r.headers.get_list("set-cookie")
        session = [c for c in cookies if c.startswith("sessionid=")]
        assert session and "Secure" in session[0], cookies
        assert all("Secure" in c for c in cookies), cookies
    finally:
        proxy.stop()


@pytest.mark.e2e
@pytest.mark.parametrize("port", ["99999", "-1"])
def test_serve_refuses_a_port_out_of_range_before_anything_starts(
    transactional_db: Any, tmp_path: Path, port: str
) -> None:
    """It listened on 99999 - 65536 = 34463 without a word; as the gateway process does,
    the web process says what to write and starts nothing."""
    import subprocess

    cp = ControlPlane(tmp_path)
    done = subprocess.run(
        [sys.executable, "manage.py", "serve", "--port", port], cwd=Path(__file__).parents[2],
        env=cp.env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert f"--port {port}: a port is 0 to 65535" in done.stderr
    assert "reconciling" not in done.stdout  # nothing started


def test_the_web_process_answers_healthz_refuses_a_foreign_host_and_closes_half_requests(
    transactional_db: Any, tmp_path: Path
) -> None:
    """``manage.py serve`` serves /v1/ as a gateway process does, so it answers a load
    balancer's /healthz the same way; /v1/ and /metrics refuse a Host not allowed (the
    console does); a connection that never finishes its headers is closed."""
    import socket

    from tests.e2e.conftest import wait_for

    web = ControlPlane(tmp_path, extra={"LLMGW_HTTP_HEADER_TIMEOUT": "2"})
    web.start()
    try:
        held = socket.create_connection(("127.0.0.1", web.port))
        held.sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Half: ")
        held.settimeout(30)

        def ok() -> bool:
            r = httpx.get(web.url + "/healthz", timeout=5)
            assert r.status_code in (200, 503), r.text
            return r.status_code == 200 and r.json() == {"status": "ok"}

        wait_for(ok, 30, "the web process's /healthz to answer ok")
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(web.url + path, headers={"Host": "evil.example"}, timeout=5)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host", r.text
        assert httpx.get(web.url + "/v1/models", timeout=5).status_code == 401  # allowed
        # Closed by the server, nothing answered (a timeout here: still open after 30 s).
        assert held.recv(1024) == b""
        held.close()
    finally:
        web.stop()
