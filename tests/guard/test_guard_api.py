"""The guard over the database and real sim judges: policy API, the check API, records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from guard.models import JudgeDecision, JudgeHealth, PolicyChange
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    proc, url = launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard",
        "--guard-categories", "Violent", "--context-length", "8192",
    )  # fmt: skip
    yield url
    proc.terminate()
    proc.wait(timeout=10)


def judge(name: str, endpoint: str | None) -> None:
    """Put a sim judge in the catalog, and a ready replica at ``endpoint`` when given."""
    guard_model(name, endpoint=endpoint)


def set_policy(api: Any, **data: Any) -> Any:
    body = {"judge": {"models": ["dead", "qwen3guard-0.6b"]}, "fail": "closed"}
    body.update(data)
    return api.patch("/api/v1/guard/policy", body, format="json")


def test_policy_baseline_then_set_and_logged(api_for: Any, operator: Any, viewer: Any) -> None:
    judge("dead", None)  # a guard model in the catalog: a policy may name only judges
    got = api_for(viewer).get("/api/v1/guard/policy").json()
    assert got["judge"]["models"] == ["qwen3guard-0.6b"] and got["fail"] == "open"
    assert set_policy(api_for(viewer)).status_code == 403
    r = set_policy(api_for(operator))
    assert r.status_code == 200, r.json()
    assert api_for(viewer).get("/api/v1/guard/policy").json()["judge"]["models"] == [
        "dead",
        "qwen3guard-0.6b",
    ]
    change = PolicyChange.objects.get()
    assert change.actor_name == "otto" and change.surface == "api"


def test_bad_policy_refused_with_paths_and_nothing_changed(api_for: Any, operator: Any) -> None:
    r = set_policy(api_for(operator), fail="maybe", judge={"models": [], "controversial": "x"})
    assert r.status_code == 400
    fields = {e["field"] for e in r.json()["errors"]}
    assert {"fail", "judge.models", "judge.controversial"} <= fields
    assert not PolicyChange.objects.exists()


def test_check_first_answer_decides_failures_recorded(
    api_for: Any, operator: Any, judge_url: str
) -> None:
    judge("dead", None)  # in the catalog, but no ready replica
    judge("qwen3guard-0.6b", judge_url)
    set_policy(api_for(operator))
    api = api_for(operator)

    r = api.post(
        "/api/v1/guard/check",
        {"request": "how do I kill all child processes in bash"},
        format="json",
    )
    body = r.json()
    assert r.status_code == 200, body
    assert (body["decision"], body["verdict"], body["judge"]) == (
        "allow",
        "safe",
        "qwen3guard-0.6b",
    )
    assert body["failures"][0]["judge"] == "dead" and body["failures"][0]["kind"] == "no_replica"
    assert body["score"] is not None and body["score"] < 0.5

    r = api.post("/api/v1/guard/check", {"request": "help me UNSAFE-MARKER now"}, format="json")
    body = r.json()
    assert (body["decision"], body["verdict"], body["categories"]) == (
        "refuse",
        "unsafe",
        ["Violent"],
    )
    assert body["score"] > 0.5

    health = {h.judge: h for h in JudgeHealth.objects.all()}
    assert health["dead"].failures == 2 and health["dead"].last_error_kind == "no_replica"
    assert health["qwen3guard-0.6b"].answers == 2 and health["qwen3guard-0.6b"].last_good_at
    counts = {
        (d.verdict, d.category): d.count
        for d in JudgeDecision.objects.filter(judge="qwen3guard-0.6b")
    }
    assert counts == {("safe", ""): 1, ("unsafe", "Violent"): 1}
    judges = {j["judge"]: j for j in api.get("/api/v1/guard/judges").json()}
    assert judges["dead"]["failures"] == 2


def test_all_judges_failing_fail_decides(api_for: Any, operator: Any) -> None:
    judge("qwen3guard-0.6b", "http://127.0.0.1:9")  # nothing listens there
    set_policy(api_for(operator), judge={"models": ["qwen3guard-0.6b"]}, fail="closed")
    body = api_for(operator).post("/api/v1/guard/check", {"request": "hello"}, format="json").json()
    assert (body["decision"], body["verdict"], body["judge"]) == ("refuse", None, None)
    assert body["failures"][0]["kind"] == "refused"
    set_policy(api_for(operator), judge={"models": ["qwen3guard-0.6b"]}, fail="open")
    body = api_for(operator).post("/api/v1/guard/check", {"request": "hello"}, format="json").json()
    assert body["decision"] == "allow" and body["failed_open"]


@pytest.mark.parametrize(("setting", "decision"), [("safe", "allow"), ("unsafe", "refuse")])
def test_controversial_follows_the_policy(
    api_for: Any, operator: Any, judge_url: str, setting: str, decision: str
) -> None:
    judge("qwen3guard-0.6b", judge_url)
    set_policy(api_for(operator), judge={"models": ["qwen3guard-0.6b"], "controversial": setting})
    body = (
        api_for(operator)
        .post("/api/v1/guard/check", {"request": "CONTROVERSIAL-MARKER"}, format="json")
        .json()
    )
    assert body["verdict"] == "controversial" and body["decision"] == decision


def test_answer_is_judged_with_its_request(api_for: Any, operator: Any, judge_url: str) -> None:
    judge("qwen3guard-0.6b", judge_url)
    set_policy(api_for(operator), judge={"models": ["qwen3guard-0.6b"]})
    body = (
        api_for(operator)
        .post(
            "/api/v1/guard/check",
            {"request": "write a poem", "answer": "UNSAFE-MARKER verses"},
            format="json",
        )
        .json()
    )
    assert body["decision"] == "refuse"


def test_check_needs_sign_in(db: Any) -> None:
    from rest_framework.test import APIClient

    assert (
        APIClient().post("/api/v1/guard/check", {"request": "x"}, format="json").status_code == 401
    )


def test_probe_keeps_each_judges_health(api_for: Any, viewer: Any, judge_url: str) -> None:
    from guard import services

    judge("qwen3guard-0.6b", judge_url)
    judge("dead", None)
    judge("gone", "http://127.0.0.1:9")
    probes = {p.judge: p for p in services.probe_judges(timeout=2)}
    ok = probes["qwen3guard-0.6b"]
    assert ok.ok and ok.ordinary_verdict == "safe" and ok.latency_ms is not None
    assert not probes["dead"].ok and probes["dead"].error == "no ready replica"
    assert not probes["gone"].ok and probes["gone"].error.startswith("refused")
    health = {h.judge: h for h in JudgeHealth.objects.all()}
    assert health["qwen3guard-0.6b"].last_good_at is not None
    assert health["gone"].failures == 1 and health["gone"].last_error_kind == "refused"
    listed = {j["judge"]: j for j in api_for(viewer).get("/api/v1/guard/judges").json()}
    assert listed["qwen3guard-0.6b"]["probe"]["ok"] is True
    assert listed["dead"]["probe"]["error"] == "no ready replica"


def test_a_sim_judges_probe_reads_harmful_unsafe(judge_url: str) -> None:
    """The judges' card showed a sim judge's probe as "harmful → safe": the sim judged
    only its marker. The harmful probe is harmful by any reading, so it says unsafe."""
    from agent.simguard import HARMFUL_PROBES
    from guard import checks, services

    assert checks.PROBE_HARMFUL in HARMFUL_PROBES  # the sim knows the probe's text
    judge("qwen3guard-0.6b", judge_url)
    (probe,) = services.probe_judges(timeout=2)
    assert probe.ok, probe.error
    assert (probe.ordinary_verdict, probe.harmful_verdict) == ("safe", "unsafe")


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({}, "request", "missing"),
        ({"request": 5}, "request", "must be a string, not a number"),
        ({"request": None}, "request", "must be a string, not null"),
        ({"request": "hi", "answer": ["x"]}, "answer", "must be a string (the answer"),
        ({"request": "hi", "anwser": "typo"}, "anwser", "unknown key"),
        (["hi"], "", "send a JSON object"),
    ],
)
def test_a_body_the_check_cannot_read_is_refused_at_its_key(
    api_for: Any, viewer: Any, body: Any, field: str, says: str
) -> None:
    r = api_for(viewer).post("/api/v1/guard/check", body, format="json")
    assert r.status_code == 400
    errors = r.json()["errors"]
    assert [e["field"] for e in errors] == [field]
    assert says in errors[0]["message"]
    assert not JudgeHealth.objects.exists() and not JudgeDecision.objects.exists()


def test_a_body_that_is_not_json_is_refused(api_for: Any, viewer: Any) -> None:
    r = api_for(viewer).post(
        "/api/v1/guard/check", "request=hi", content_type="application/x-www-form-urlencoded"
    )
    assert r.status_code == 415
    assert "Unsupported media type" in r.json()["detail"]
    r = api_for(viewer).post("/api/v1/guard/check", "{not json", content_type="application/json")
    assert r.status_code == 400 and "JSON parse error" in r.json()["detail"]


def test_a_check_inside_a_transaction_is_recorded_in_it_even_with_the_recorder_running(
    api_for: Any, operator: Any, judge_url: str
) -> None:
    from guard import records

    judge("qwen3guard-0.6b", judge_url)
    set_policy(api_for(operator), judge={"models": ["qwen3guard-0.6b"]})
    records.RECORDER.start()
    try:
        body = api_for(operator).post("/api/v1/guard/check", {"request": "hi"}, format="json")
        assert body.json()["judge"] == "qwen3guard-0.6b"
        # Written at once, in this test's transaction (which rolls it back): not left to
        # the recorder's thread, which could not see this transaction's judge at all.
        assert JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers == 1
        assert not records.RECORDER.pending()
    finally:
        records.RECORDER.stop()
