"""A judge that hangs, in production: the web
process, worker, beat and two ``gateway serve`` processes, real agents and sim engines, an
openai-client load on both gateways throughout. The judge's engine is stopped (SIGSTOP:
its port still accepts connections and answers nothing, as a hung engine does) and
resumed (SIGCONT).

Every request is answered (none waits on the judge past its timeout and none fails), the
judge is recorded as timed out, its breaker opens in the gateways and closes again once it
answers, and the Guard page in Chromium shows it open, then closed, without a reload.
Then under ``fail: closed``, hung again: every request is refused (400), and each refusal
record says no judge answered, the judge, and how it failed (timeout, then breaker_open).
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import openai
import pytest

from cluster.models import Assignment
from gateway.models import Refusal
from guard.models import JudgeBreaker, JudgeHealth
from guard.services import set_policy
from tests.browser.conftest import wait_js
from tests.e2e.conftest import Agent, wait_for
from tests.e2e.faultplane import FaultPlane, sim_model

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

JUDGE_TIMEOUT = 1
FAILURES = 3

# Records, in the page, each state the judge's breaker shows as the DOM changes.
SEEN = """
() => {
  window.__breaker = [];
  const look = () => {
    const dd = document.querySelector('#guard-judge-judge-health [data-role=judge-breaker]');
    const s = dd ? dd.dataset.state : null;
    if (s && window.__breaker[window.__breaker.length - 1] !== s) window.__breaker.push(s);
  };
  look();
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true});
}
"""


@pytest.fixture
def plane(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> FaultPlane:
    """The fault plane, its processes started with a short judge timeout and breaker."""
    monkeypatch.setenv("LLMGW_GUARD_JUDGE_TIMEOUT", str(JUDGE_TIMEOUT))
    monkeypatch.setenv("LLMGW_GUARD_BREAKER_FAILURES", str(FAILURES))
    monkeypatch.setenv("LLMGW_GUARD_BREAKER_BACKOFF", "2")
    monkeypatch.setenv("LLMGW_GUARD_BREAKER_MAX_BACKOFF", "4")
    return request.getfixturevalue("fault_plane")  # type: ignore[no-any-return]


def judge_pid() -> int:
    a = Assignment.objects.filter(replica__model_name="judge", state="ready").exclude(pid=None)
    return int(a.values_list("pid", flat=True).first() or 0)


def test_a_hung_judge_delays_no_request_past_its_timeout_its_breaker_shows_and_fail_closed_refuses(
    plane: FaultPlane, agents: Callable[..., Agent], console: Callable[..., Any], operator: Any
) -> None:  # fmt: skip
    plane.sim_cluster(agents, model="steady", replicas=2)
    from tests.catalog.samples import store

    store(sim_model("judge", 1, role="guard", guard={"format": "qwen3guard"}))
    wait_for(judge_pid, 120, "the judge's engine ready")
    # Saved from here (the database is shared): `guard policy set` in this arrangement did
    # not exit after saving (left for the lead: its Redis at exit).
    set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"], "fail": "open"},
               surface="cli", name="test")  # fmt: skip
    key = plane.key("load")
    page = console(operator, "/guard/")
    page.evaluate(SEEN)
    pid = judge_pid()
    with plane.load(key, "steady", clients=4, timeout=60) as load:
        load.wait_for_answers(20)
        wait_for(lambda: (h := JudgeHealth.objects.filter(judge="judge").first()) and h.answers,
                 30, "the judge answering")  # fmt: skip
        hung_at = load.now()
        os.killpg(pid, signal.SIGSTOP)
        try:
            wait_js(page, "() => document.querySelector("
                    "'#guard-judge-judge-health [data-role=judge-breaker]').dataset.state === 'open'",
                    timeout=60, what="the breaker shown open")  # fmt: skip
            opened = set(JudgeBreaker.objects.filter(judge="judge", state="open")
                         .values_list("process", flat=True))  # fmt: skip
            load.wait_for_answers(40)  # served while the judge is skipped
        finally:
            os.killpg(pid, signal.SIGCONT)
        healed_at = load.now()
        wait_js(page, "() => document.querySelector("
                "'#guard-judge-judge-health [data-role=judge-breaker]').dataset.state === 'closed'",
                timeout=60, what="the breaker shown closed")  # fmt: skip
        load.wait_for_answers(20)
    seen = page.evaluate("window.__breaker")
    assert "open" in seen and seen[-1] == "closed", seen
    assert seen.index("open") < len(seen) - 1
    health = JudgeHealth.objects.get(judge="judge")
    assert health.failures >= FAILURES and health.last_error_kind == "timeout", health.last_error
    during = [o for o in load.since(hung_at) if o.at <= healed_at]
    seconds = sorted(o.seconds for o in during)
    sys.stderr.write(
        f"\njudge hung {healed_at - hung_at:.1f} s under fail: open: {len(during)} requests "
        f"answered meanwhile, {load.summary()}; latency p50 {statistics.median(seconds):.2f} s, "
        f"max {seconds[-1]:.2f} s (judge timeout {JUDGE_TIMEOUT} s); judge failures "
        f"{health.failures}, last {health.last_error_kind}; open in {sorted(opened)}; page saw {seen}\n"
    )
    assert load.failures == [], load.summary()
    assert during, "no request was answered while the judge hung"
    # The hung judge delays a request by at most its timeout: no answer while it hung took
    # longer than the judge's timeout beside the slowest answer before it hung, and a
    # second for the loaded machine's scheduling.
    before = [o.seconds for o in load.outcomes if o.at + o.seconds < hung_at]
    bound = JUDGE_TIMEOUT + max(before) + 1.0
    assert seconds[-1] <= bound, (seconds[-5:], bound, load.summary())

    # Fail closed, the judge hung again: each gateway refuses (400), at once once its
    # breaker is open, and every record says no judge answered, which failed and how.
    set_policy({"judge": {"models": ["judge"]}, "directions": ["requests"], "fail": "closed"},
               surface="cli", name="test")  # fmt: skip
    clients = [openai.OpenAI(base_url=u + "/v1", api_key=key, max_retries=0, timeout=60)
               for u in plane.urls()]  # fmt: skip
    os.killpg(pid, signal.SIGSTOP)
    ids: list[str] = []
    try:
        for c in clients:
            # Until this gateway reads the new policy (about a second), fail: open allows.
            wait_for(lambda c=c: _refused(c, ids), 30, "fail: closed in force")
            for _ in range(FAILURES + 2):
                assert _refused(c, ids), "allowed with no judge answering under fail: closed"
    finally:
        os.killpg(pid, signal.SIGCONT)
    rows = wait_for(lambda: (r := list(Refusal.objects.filter(request_id__in=ids)))
                    and len(r) == len(ids) and r, 30, "the refusal records")  # fmt: skip
    kinds = Counter(f["kind"] for r in rows for f in r.failures)
    assert all(r.judged is False and r.judge == "" for r in rows)
    assert all([f["judge"] for f in r.failures] == ["judge"] for r in rows)
    assert set(kinds) <= {"timeout", "breaker_open"} and kinds["timeout"] and kinds["breaker_open"]
    sys.stderr.write(f"judge hung under fail: closed: {len(ids)} requests refused (400), "
                     f"records judged false, failures {dict(kinds)}\n")  # fmt: skip


def _refused(client: openai.OpenAI, ids: list[str]) -> bool:
    """Ask; True when refused (400 content_filter), its request id kept in ``ids``."""
    try:
        client.chat.completions.create(
            model="steady", messages=[{"role": "user", "content": "/echo closed"}]
        )
    except openai.BadRequestError as refused:
        assert refused.code == "content_filter", refused
        ids.append(refused.response.headers["x-request-id"])
        return True
    return False
