"""Issue 16 item 8: an engine's port refuses whoever is not llmgw.

Production's processes (web, worker, beat, two ``gateway serve``), real agents starting
sim engines with their replicas' keys, the official openai client under load: every
request through a gateway is answered, while a call straight to a replica's port, a
generator's or a judge's, with no key or a wrong one is refused with 401; the guard's
check still judges (a marked text is refused through the gateway, so its judge answered
the gateway's call); and no engine key appears in a page, an API answer or any log the
processes wrote.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest

from cluster.enginekeys import engine_key
from cluster.models import Node, Replica
from tests.browser.conftest import PASSWORD
from tests.e2e.conftest import Agent, engine_auth, wait_for
from tests.e2e.faultplane import FaultPlane

pytestmark = pytest.mark.e2e

JUDGE = "qwen3guard-0.6b"
CHAT = {"model": "steady", "messages": [{"role": "user", "content": "/echo hi"}]}
WRONG = ("", "Bearer llmgw_engine_wrong", "Basic bGxtZ3c6")


def _direct(url: str, path: str, body: dict[str, object], auth: str) -> int:
    headers = {"Authorization": auth} if auth else {}
    return httpx.post(url + path, json=body, headers=headers, timeout=10).status_code


def _signed_in(url: str) -> httpx.Client:
    from django.contrib.auth.models import Group, User

    user = User.objects.create_user("ops", password=PASSWORD, is_staff=True)
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client = httpx.Client(base_url=url, timeout=20)
    client.get("/login/")
    r = client.post(
        "/login/",
        data={"username": "ops", "password": PASSWORD,
              "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        headers={"Referer": f"{url}/login/"},
    )  # fmt: skip
    assert r.status_code == 302, r.text
    return client


def test_engine_ports_refuse_all_but_llmgw_while_the_gateways_serve(
    fault_plane: FaultPlane, agents: Callable[..., Agent], tmp_path: Path
) -> None:
    from catalog.choices import Surface
    from catalog.services import Actor
    from guard import checks as guard_checks
    from guard import services as guard_services

    fault_plane.sim_cluster(agents, model="steady", replicas=2)
    actor = Actor(None, Surface.CLI, name="e2e")
    guard_services.enable_judge(JUDGE, gpu=False, sim=True, actor=actor)
    guard_services.use_judges([JUDGE], surface="cli", name="e2e")
    wait_for(
        lambda: Replica.objects.filter(model_name=JUDGE, state="ready").exists(),
        120,
        "the judge's replica ready",
    )
    key = fault_plane.key("load")
    urls = [*fault_plane.urls(), fault_plane.url]  # both gateways, and the web process's /v1

    with fault_plane.load(key, "steady") as load:
        load.wait_for_answers(20)
        replicas = list(Replica.objects.filter(state="ready", desired=True).exclude(endpoint=""))
        assert {r.model_name for r in replicas} == {"steady", JUDGE}
        for r in replicas:
            good = engine_auth(r.pk)["Authorization"]
            other = f"Bearer {engine_key(r.pk + 1000)}"  # a key, of another replica
            if r.model_name == JUDGE:
                calls = [("/v1/completions", {"prompt": "hi", "max_tokens": 1})]
            else:
                calls = [("/v1/chat/completions", CHAT), ("/tokenize", {"content": "hi"})]
            for path, body in calls:
                assert [_direct(r.endpoint, path, body, a) for a in (*WRONG, other)] == [401] * 4
                assert _direct(r.endpoint, path, body, good) == 200, (r.model_name, path)
            assert httpx.get(r.endpoint + "/health", timeout=10).status_code == 200

        # The guard's client carries the judge's key: a marked text is refused through
        # every gateway (under the default fail: open, a judge refusing the gateway
        # would let it through), an ordinary one answered.
        for url in urls:
            client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
            with pytest.raises(openai.BadRequestError) as refused:
                client.chat.completions.create(
                    model="steady",
                    messages=[{"role": "user", "content": "please UNSAFE-MARKER"}],
                )
            assert "unsafe" in str(refused.value).lower() or refused.value.status_code == 400
            answer = client.chat.completions.create(**CHAT)  # type: ignore[call-overload]
            assert answer.choices[0].message.content == "hi"
        # And the test process's own check (the API's path) asks the judge with its key.
        body = guard_checks.check("please UNSAFE-MARKER")
        assert (body["decision"], body["judge"], body["failures"]) == ("refuse", JUDGE, [])
        load.wait_for_answers(20)
    assert load.failures == [], load.summary()
    print(f"engine keys: {load.summary()}")  # noqa: T201 (the figures for the note)

    # No key in a page, an API answer or a log the tests can read.
    keys = {engine_key(r.pk) for r in Replica.objects.all()}
    assert keys
    console = _signed_in(fault_plane.url)
    judge_id = Replica.objects.filter(model_name=JUDGE).values_list("pk", flat=True).first()
    node_id = Node.objects.values_list("pk", flat=True).first()
    # The console's chat (the web process's gateway, for the session) reaches the replica
    # with its key too.
    said = console.post(
        "/console/chat/v1/chat/completions",
        json=CHAT,
        headers={"X-CSRFToken": console.cookies["csrftoken"], "Origin": fault_plane.url},
    )
    assert said.status_code == 200, said.text
    assert said.json()["choices"][0]["message"]["content"] == "hi"
    seen = []
    for path in (
        "/cluster/", "/catalog/", "/catalog/models/steady/", f"/guard/judges/{JUDGE}/",
        "/guard/", "/gateway/traffic/", "/api/v1/cluster/replicas/",
        f"/api/v1/cluster/replicas/{judge_id}/", "/api/v1/cluster/nodes/",
        "/api/v1/cluster/status/", "/api/v1/catalog/models/steady/",
        f"/admin/cluster/node/{node_id}/change/",
    ):  # fmt: skip
        page = console.get(path)
        assert page.status_code == 200, (path, page.status_code)
        seen.append(path)
        assert not [k for k in keys if k in page.text], path
    logs = [
        p for p in tmp_path.rglob("*")
        # engines.json: the agent's own record of what it started (mode 0600), which
        # holds the keys to restart its engines with; the engines' environments hold
        # them too, and nothing else may.
        if p.is_file() and p.name != "engines.json"
    ]  # fmt: skip
    assert any(p.name.startswith("gw") for p in logs) and any("agent-" in str(p) for p in logs)
    for p in logs:
        data = p.read_bytes()
        assert not [k for k in keys if k.encode() in data], p
