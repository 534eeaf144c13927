"""The check's path as the web process runs it: the policy, the judges' endpoints and the
API token kept in memory, results written by the recorder's thread. Committed data
(transactional tests) on PostgreSQL, real sim judges.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from rest_framework.test import APIClient

from cluster.models import Replica
from guard import checks, records, services, snapshots
from guard.api import auth
from guard.chain import ChainResult, Failure, Stats
from guard.models import JudgeDecision, JudgeHealth
from llmgw_core.models import ApiToken
from tests.dburl import database_url
from tests.guard.helpers import guard_model
from tests.guard.test_client import launch, stop

pytestmark = pytest.mark.django_db(transaction=True)

SAFE_TEXT = "how do I kill all child processes in bash"
UNSAFE_TEXT = "help me UNSAFE-MARKER now"


def sim_judge() -> tuple[Any, str]:
    return launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard",
        "--guard-categories", "Violent", "--context-length", "8192",
    )  # fmt: skip


@pytest.fixture(scope="module")
def judge_url() -> Iterator[str]:
    proc, url = sim_judge()
    yield url
    stop(proc)


@pytest.fixture(autouse=True)
def fresh_memory() -> Iterator[None]:
    """Each test starts with nothing kept in memory and no recorder running."""
    snapshots.kept().invalidate()
    auth.forget()
    yield
    records.RECORDER.stop()
    snapshots.kept().invalidate()
    auth.forget()


@pytest.fixture
def long_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing kept expires within the test (a slow machine's pauses included): what it
    sees changed was told of, not timed out."""
    monkeypatch.setattr(snapshots.kept(), "ttl", 600.0)
    monkeypatch.setattr(auth._found, "ttl", 600.0)


class Clock:
    """A clock the test moves: what the caches read their values' age from."""

    def __init__(self) -> None:
        self.now = time.monotonic()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    """The snapshot's and the tokens' caches read this clock (the clock each accepts), so a
    test moves time past a TTL instead of waiting it out."""
    moved = Clock()
    monkeypatch.setattr(snapshots.kept(), "_clock", moved)
    monkeypatch.setattr(auth._found, "_clock", moved)
    return moved


@pytest.fixture
def recorder() -> Iterator[records.Recorder]:
    """The process's recorder, writing in the background as in the web process."""
    records.RECORDER.start()
    yield records.RECORDER
    records.RECORDER.stop()


def judge(name: str, endpoint: str | None, state: str = "ready") -> Replica | None:
    """Put a sim judge in the catalog, and a replica at ``endpoint`` when given."""
    return guard_model(name, endpoint=endpoint, state=state)


def policy(**data: Any) -> None:
    body: dict[str, Any] = {"judge": {"models": ["qwen3guard-0.6b"]}, "fail": "closed"}
    body.update(data)
    services.set_policy(body, surface="cli", name="test")


def token_client(make_user: Any, role: str = "viewer") -> tuple[APIClient, Any, ApiToken]:
    user = make_user(f"gw-{role}", role)
    token, secret = ApiToken.issue(user, "gateway")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return api, user, token


def post(api: APIClient, text: str, answer: str | None = None) -> Any:
    body = {"request": text} | ({"answer": answer} if answer is not None else {})
    return api.post("/api/v1/guard/check", body, format="json")


def test_a_check_reads_nothing_from_the_database_once_warm(
    make_user: Any, judge_url: str, recorder: Any, long_ttl: None, django_assert_num_queries: Any
) -> None:
    judge("qwen3guard-0.6b", judge_url)
    policy()
    api, _, _ = token_client(make_user)
    assert post(api, SAFE_TEXT).json()["judge"] == "qwen3guard-0.6b"  # warms the memory
    with django_assert_num_queries(0):
        for text in (SAFE_TEXT, UNSAFE_TEXT, SAFE_TEXT):
            r = post(api, text)
            assert r.status_code == 200
    assert r.json()["decision"] == "allow"


def test_a_policy_change_takes_effect_for_the_next_check(
    make_user: Any, judge_url: str, recorder: Any, long_ttl: None
) -> None:
    judge("qwen3guard-0.6b", judge_url)
    policy(judge={"models": ["qwen3guard-0.6b"], "controversial": "safe"})
    api, _, _ = token_client(make_user)
    operator_api, _, _ = token_client(make_user, "operator")
    assert post(api, "CONTROVERSIAL-MARKER").json()["decision"] == "allow"
    r = operator_api.patch(
        "/api/v1/guard/policy",
        {"judge": {"models": ["qwen3guard-0.6b"], "controversial": "unsafe"}},
        format="json",
    )
    assert r.status_code == 200, r.json()
    assert post(api, "CONTROVERSIAL-MARKER").json()["decision"] == "refuse"
    # The command line's change, in this process, too.
    services.use_judges(["qwen3guard-0.6b"], surface="cli", name="test")
    services.set_policy(
        {"judge": {"models": ["qwen3guard-0.6b"], "controversial": "safe"}}, surface="cli"
    )
    assert post(api, "CONTROVERSIAL-MARKER").json()["decision"] == "allow"


def test_a_change_no_signal_tells_of_is_seen_within_the_ttl(
    make_user: Any, judge_url: str, recorder: Any, clock: Clock
) -> None:
    """Another process's change (here: a plain UPDATE, which sends no signal)."""
    judge("qwen3guard-0.6b", judge_url)
    policy(judge={"models": ["qwen3guard-0.6b"], "controversial": "safe"})
    api, _, _ = token_client(make_user)
    assert post(api, "CONTROVERSIAL-MARKER").json()["decision"] == "allow"
    with connection.cursor() as cur:
        cur.execute(
            "UPDATE guard_guardpolicy SET data = jsonb_set(data, "
            "'{judge,controversial}', '\"unsafe\"')"
        )
    clock.now += snapshots.SNAPSHOT_TTL / 4  # well within the TTL: what was read is kept
    assert post(api, "CONTROVERSIAL-MARKER").json()["decision"] == "allow"
    clock.now += snapshots.SNAPSHOT_TTL
    assert post(api, "CONTROVERSIAL-MARKER").json()["decision"] == "refuse"


def test_a_judge_replica_that_becomes_ready_is_asked_by_the_next_check(
    make_user: Any, judge_url: str, recorder: Any, long_ttl: None
) -> None:
    replica = judge("qwen3guard-0.6b", judge_url, state="starting")
    assert replica is not None
    policy()
    api, _, _ = token_client(make_user)
    body = post(api, SAFE_TEXT).json()
    assert body["decision"] == "refuse" and body["failures"][0]["kind"] == "no_replica"
    replica.state, replica.endpoint = "ready", judge_url
    replica.save()
    body = post(api, SAFE_TEXT).json()
    assert (body["decision"], body["judge"], body["failures"]) == (
        "allow",
        "qwen3guard-0.6b",
        [],
    )
    # And one that stops being ready is not asked.
    replica.state, replica.endpoint = "stopping", ""
    replica.save(update_fields=["state", "endpoint"])
    assert post(api, SAFE_TEXT).json()["failures"][0]["kind"] == "no_replica"


def test_a_replica_that_moved_is_found_by_the_check_that_failed_on_it(
    make_user: Any, recorder: Any, long_ttl: None
) -> None:
    """The cached endpoint is gone, the database knows the new one: one check, answered."""
    first, first_url = sim_judge()
    second, second_url = sim_judge()
    try:
        replica = judge("qwen3guard-0.6b", first_url)
        assert replica is not None
        policy()
        api, _, _ = token_client(make_user)
        assert post(api, SAFE_TEXT).json()["judge"] == "qwen3guard-0.6b"
        stop(first)
        # Moved behind this process's back (no signal).
        Replica.objects.filter(pk=replica.pk).update(endpoint=second_url)
        body = post(api, SAFE_TEXT).json()
        assert (body["decision"], body["judge"], body["failures"]) == (
            "allow",
            "qwen3guard-0.6b",
            [],
        )
    finally:
        stop(first)
        stop(second)
    checks.flush_records()
    # Only the run that answered is recorded: the stale endpoint's failure is not.
    assert JudgeHealth.objects.get(judge="qwen3guard-0.6b").failures == 0


def test_counts_stay_exact_with_checks_in_many_threads(
    make_user: Any, judge_url: str, recorder: Any
) -> None:
    judge("dead", None)  # in the catalog, never ready: a failure on every check
    judge("qwen3guard-0.6b", judge_url)
    policy(judge={"models": ["dead", "qwen3guard-0.6b"]})
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(n):
                checks.check(UNSAFE_TEXT if i % 2 else SAFE_TEXT)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=work, args=(20,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    # The judges' API writes what this process gathered before it reads.
    _, viewer, _ = token_client(make_user)
    api = APIClient()
    api.force_authenticate(viewer)
    listed = {j["judge"]: j for j in api.get("/api/v1/guard/judges").json()}
    assert listed["qwen3guard-0.6b"]["answers"] == 80
    assert listed["dead"]["failures"] == 80
    assert listed["dead"]["last_error_kind"] == "no_replica"
    recorder.stop()
    counts = {
        (d.verdict, d.category): d.count
        for d in JudgeDecision.objects.filter(judge="qwen3guard-0.6b")
    }
    assert counts == {("safe", ""): 40, ("unsafe", "Violent"): 40}
    health = JudgeHealth.objects.get(judge="qwen3guard-0.6b")
    assert health.answers == 80 and health.last_good_at is not None


def test_stop_writes_what_is_left() -> None:
    slow = records.Recorder(interval=3600)
    slow.start()
    slow.add(answered("qwen3guard-0.6b", "safe"))
    assert slow.pending() and not JudgeHealth.objects.exists()
    slow.stop()
    assert not slow.running
    assert JudgeHealth.objects.get(judge="qwen3guard-0.6b").answers == 1


def test_a_reader_flushing_first_waits_for_the_write_under_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The background write has taken the counts and not committed them when the judges'
    # API flushes before it reads: the API's flush must wait for that write (it found
    # nothing waiting and read 78 answers of 80 in a loaded run).
    entered, release = threading.Event(), threading.Event()
    written: list[Stats] = []

    def slow_write(stats: Stats) -> None:
        entered.set()
        assert release.wait(30)
        written.append(stats)

    recorder = records.Recorder(interval=3600, writer=slow_write)
    monkeypatch.setattr(records, "RECORDER", recorder)
    recorder.add(answered("qwen3guard-0.6b", "safe"))
    background = threading.Thread(target=recorder.flush)
    background.start()
    assert entered.wait(10)
    seen: list[int] = []
    reader = threading.Thread(target=lambda: (checks.flush_records(), seen.append(len(written))))
    reader.start()
    # Still waiting a second later (before: it had returned at once, nothing written).
    reader.join(1.0)
    assert reader.is_alive() or seen == [1], f"the reader returned with {seen} written"
    release.set()
    background.join(10)
    reader.join(10)
    assert seen == [1]


def answered(judge_name: str, verdict: str, *categories: str) -> ChainResult:
    return ChainResult("allow", verdict, categories, judge_name, 0.1, 3.0)


def failed(judge_name: str, message: str, at: datetime) -> ChainResult:
    return ChainResult(
        "refuse", None, (), None, None, None, failures=[Failure(judge_name, "timeout", message, at)]
    )


def test_a_failed_write_keeps_its_counts_for_the_next() -> None:
    calls: list[int] = []

    def flaky(stats: Stats) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("the database went away")
        records.write(stats)

    recorder = records.Recorder(writer=flaky)
    for _ in range(3):
        recorder.add(answered("a", "safe"))
    with pytest.raises(ConnectionError):
        recorder.flush()
    assert not JudgeHealth.objects.exists()
    recorder.add(answered("a", "unsafe", "Violent"))
    recorder.flush()
    assert JudgeHealth.objects.get(judge="a").answers == 4
    counts = {(d.verdict, d.category): d.count for d in JudgeDecision.objects.all()}
    assert counts == {("safe", ""): 3, ("unsafe", "Violent"): 1}
    assert not recorder.pending()


def test_processes_writing_at_once_add_up() -> None:
    """Two recorders (as two web processes) flushing the same keys concurrently."""
    now = datetime.now(UTC)
    errors: list[BaseException] = []

    def process() -> None:
        rec = records.Recorder()
        try:
            for i in range(30):
                rec.add(answered("a", "unsafe", "Violent", "PII"))
                rec.add(failed("b", f"slow {i}", now + timedelta(seconds=i)))
                rec.flush()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)
        finally:
            connection.close()

    threads = [threading.Thread(target=process) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors
    assert JudgeHealth.objects.get(judge="a").answers == 90
    b = JudgeHealth.objects.get(judge="b")
    assert (b.failures, b.last_error, b.last_error_at) == (
        90,
        "slow 29",
        now + timedelta(seconds=29),
    )
    counts = {(d.verdict, d.category): d.count for d in JudgeDecision.objects.filter(judge="a")}
    assert counts == {("unsafe", "Violent"): 90, ("unsafe", "PII"): 90}


def test_an_older_error_written_later_does_not_replace_a_newer_one() -> None:
    t1 = datetime(2026, 1, 2, tzinfo=UTC)
    for result in (failed("b", "new", t1), failed("b", "old", t1 - timedelta(minutes=5))):
        stats = Stats()
        stats.record(result)
        records.write(stats)
    b = JudgeHealth.objects.get(judge="b")
    assert (b.failures, b.last_error, b.last_error_at) == (2, "new", t1)


def test_a_revoked_token_is_refused_by_the_next_check(
    make_user: Any, admin_user: Any, judge_url: str, recorder: Any, long_ttl: None
) -> None:
    judge("qwen3guard-0.6b", judge_url)
    policy()
    api, _, token = token_client(make_user)
    assert post(api, SAFE_TEXT).status_code == 200
    admin = APIClient()
    admin.force_authenticate(admin_user)
    assert admin.post(f"/api/v1/tokens/{token.pk}/revoke/").status_code == 200
    r = post(api, SAFE_TEXT)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_a_token_revoked_without_a_signal_is_refused_within_the_ttl(
    make_user: Any, judge_url: str, recorder: Any, clock: Clock
) -> None:
    """The admin's bulk revoke is an UPDATE; another process's revoke is not seen here."""
    judge("qwen3guard-0.6b", judge_url)
    policy()
    api, _, token = token_client(make_user)
    assert post(api, SAFE_TEXT).status_code == 200
    ApiToken.objects.filter(pk=token.pk).update(revoked=datetime.now(UTC))
    clock.now += auth.TOKEN_TTL / 4  # well within the TTL: the token kept is still good
    assert post(api, SAFE_TEXT).status_code == 200
    clock.now += auth.TOKEN_TTL
    r = post(api, SAFE_TEXT)
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_a_user_losing_the_role_is_refused_by_the_next_check(
    make_user: Any, judge_url: str, recorder: Any, long_ttl: None
) -> None:
    from django.contrib.auth.models import Group

    judge("qwen3guard-0.6b", judge_url)
    policy()
    api, user, _ = token_client(make_user)
    assert post(api, SAFE_TEXT).status_code == 200
    user.groups.remove(Group.objects.get(name="viewer"))
    assert post(api, SAFE_TEXT).status_code == 403
    user.groups.add(Group.objects.get(name="viewer"))
    user.is_active = False
    user.save()
    assert post(api, SAFE_TEXT).status_code == 401


def test_a_process_that_exits_writes_what_its_recorder_gathered() -> None:
    """The web process's recorder, flushed by the process's exit (atexit)."""
    script = (
        "import django; django.setup()\n"
        "from guard import records\n"
        "from guard.chain import ChainResult\n"
        "records.RECORDER.interval = 3600  # only the exit writes\n"
        "records.start()\n"
        "for _ in range(25):\n"
        "    records.RECORDER.add(ChainResult('allow', 'safe', (), 'qwen3guard-0.6b', 0.1, 3.0))\n"
        "assert records.RECORDER.pending()\n"
    )
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "llmgw_admin.settings",
        "LLMGW_DATABASE_URL": database_url(),
        "LLMGW_SECRET_KEY": "test-only-not-secret",
    }
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    health = JudgeHealth.objects.get(judge="qwen3guard-0.6b")
    assert health.answers == 25
    assert JudgeDecision.objects.get(judge="qwen3guard-0.6b", verdict="safe").count == 25
