"""Starting an evaluation from the console: who may, what a refusal looks like, and the
run asked in the background (a thread when embedded, a real Celery worker in
production) against a real sim judge.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.db import close_old_connections
from django.test import Client, override_settings
from django.urls import reverse

from guard import evalrun
from guard.models import EvalResult, EvalRun
from tests.cluster.test_celery_worker import REDIS, celery_worker
from tests.faultproxy import fault_proxy
from tests.guard.helpers import guard_model
from tests.guard.test_check_on_loop import policy
from tests.guard.test_client import launch, stop
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

START = "/guard/evals/run/"


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    # Harmful texts of the packaged set carry no marker: the sim calls them safe. The
    # figures are not the point here; that every text is asked and kept is.
    proc, url = launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard",
        "--ttft", "0", "--tps", "100000",
    )  # fmt: skip
    yield url
    stop(proc)


def signed_in(make_user: Any, role: str) -> Client:
    c = Client()
    c.force_login(make_user(f"u-{role}", role))
    return c


def wait_done(pk: int, timeout: float = 60) -> EvalRun:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = EvalRun.objects.get(pk=pk)
        if run.status != EvalRun.Status.RUNNING:
            return run
        time.sleep(0.2)
    raise AssertionError(f"evaluation {pk} still running after {timeout} s")


def test_a_viewer_sees_no_form_and_is_refused(make_user: Any, sim_url: str) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    c = signed_in(make_user, "viewer")
    page = c.get(reverse("guard:eval_list")).content.decode()
    assert "Run an evaluation" not in page and START not in page
    r = c.post(START, {"judges": ["qwen3guard-0.6b"], "set_name": "coding-ops"})
    assert r.status_code == 403
    assert not EvalRun.objects.exists()


def test_an_operator_is_offered_the_catalogs_judges_and_the_packaged_sets(
    make_user: Any, sim_url: str
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    policy("qwen3guard-0.6b")
    page = signed_in(make_user, "operator").get(reverse("guard:eval_list")).content.decode()
    assert "Run an evaluation" in page
    assert 'value="qwen3guard-0.6b"' in page and "checked" in page  # the policy's judge
    assert '<option value="coding-ops" selected>' in page


@pytest.mark.parametrize(
    ("data", "field", "says"),
    [
        ({"set_name": "coding-ops"}, "judges", "choose at least one judge"),
        ({"judges": ["no-such-judge"], "set_name": "coding-ops"}, "judges", "not one of"),
        ({"judges": ["qwen3guard-0.6b"], "set_name": "../../etc/passwd"}, "set_name", "not one of"),
    ],
)
def test_a_refused_start_says_why_at_the_field_and_starts_nothing(
    make_user: Any, sim_url: str, data: dict[str, Any], field: str, says: str
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    r = signed_in(make_user, "operator").post(START, data)
    assert r.status_code == 400
    errors = r.content.decode().split(f'id="guard-eval-err-{field}"', 1)[1].split("</div>", 1)[0]
    assert says in errors
    assert not EvalRun.objects.exists()


@override_settings(REDIS_URL="")
def test_embedded_the_run_is_asked_by_a_thread_and_its_page_fills_in(
    make_user: Any, sim_url: str
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    policy("qwen3guard-0.6b")
    c = signed_in(make_user, "operator")
    r = c.post(START, {"judges": ["qwen3guard-0.6b"], "set_name": "coding-ops"})
    assert r.status_code == 302
    run = EvalRun.objects.get()
    assert r["Location"] == reverse("guard:eval_detail", args=[run.pk])
    assert (run.actor_name, run.surface, run.judges) == (
        "u-operator",
        "console",
        ["qwen3guard-0.6b"],
    )
    run = wait_done(run.pk)
    assert run.status == "done" and run.error == ""
    # The sim judge calls a text unsafe only by its marker, or when it is the guard's own
    # harmful probe, which this set holds once (labelled harmful).
    unsafe = list(EvalResult.objects.filter(run=run, verdict="unsafe"))
    assert len(unsafe) == 1
    assert EvalResult.objects.filter(run=run, verdict="safe").count() == run.texts - 1
    page = c.get(r["Location"]).content.decode()
    assert "ws-connect" not in page  # done: nothing left to push
    assert 'data-status="done"' in page and 'data-judge="qwen3guard-0.6b"' in page


@override_settings(REDIS_URL="")
def test_a_run_whose_set_changed_before_it_was_asked_fails_saying_so(
    make_user: Any, sim_url: str, tmp_path: Path
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    source = tmp_path / "mine.yaml"
    source.write_text(
        "name: mine\ntexts:\n  - {text: list files, label: ordinary}\n"
        "  - {text: hurt someone, label: harmful}\n"
    )
    loaded = evalrun.load_set(str(source))
    run = evalrun.begin(loaded, ["qwen3guard-0.6b"], surface="console", actor_name="t")
    source.write_text(source.read_text() + "  - {text: one more, label: ordinary}\n")
    evalrun.execute_kept(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and "changed after the evaluation was started" in run.error
    assert not run.results.exists()


def test_in_production_a_celery_worker_asks_the_run(
    make_user: Any, sim_url: str, tmp_path: Path
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    with celery_worker(tmp_path), override_settings(REDIS_URL=REDIS):
        r = signed_in(make_user, "operator").post(
            START, {"judges": ["qwen3guard-0.6b"], "set_name": "coding-ops"}
        )
        assert r.status_code == 302
        run = wait_done(EvalRun.objects.get().pk, timeout=90)
    assert run.status == "done", run.error
    assert run.results.count() == run.texts


def test_a_run_given_back_by_a_worker_that_died_is_asked_again_from_the_start(
    make_user: Any, sim_url: str
) -> None:
    guard_model("qwen3guard-0.6b", endpoint=sim_url)
    loaded = evalrun.load_set("coding-ops")
    run = evalrun.begin(loaded, ["qwen3guard-0.6b"], surface="console", actor_name="t")
    # What a worker wrote before it died: its first texts.
    first = evalrun.load_set("coding-ops").labelled.texts[:3]
    EvalResult.objects.bulk_create(
        EvalResult(run=run, judge="qwen3guard-0.6b", position=i, text=t.text, label=t.label)
        for i, t in enumerate(first)
    )
    evalrun.execute_kept(run.pk)
    run.refresh_from_db()
    assert run.status == "done"
    assert run.results.count() == run.texts
    assert run.results.filter(verdict="").count() == 0  # the dead worker's rows are gone


def test_a_second_delivery_of_the_task_while_the_first_asks_does_nothing(
    make_user: Any, sim_url: str
) -> None:
    """A task published twice (a publish retried after Redis answered late) reaches two
    workers: the second must leave the run to the first, not ask it over (the results'
    keys are unique: two copies asking at once made one fail the run)."""
    where = urlsplit(sim_url)
    failed: list[BaseException] = []

    def deliver(pk: int) -> None:
        try:
            evalrun.execute_kept(pk)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            failed.append(exc)
        finally:
            close_old_connections()

    with fault_proxy((where.hostname or "127.0.0.1", where.port or 80)) as proxy:
        guard_model("qwen3guard-0.6b", endpoint=f"http://127.0.0.1:{proxy.port}")
        run = evalrun.begin(evalrun.load_set("coding-ops"), ["qwen3guard-0.6b"],
                            surface="console", actor_name="t")  # fmt: skip
        proxy.hang()
        first = threading.Thread(target=deliver, args=(run.pk,), daemon=True)
        first.start()
        second = threading.Thread(target=deliver, args=(run.pk,), daemon=True)
        try:
            wait_until(lambda: proxy.held, 30, "the first delivery to ask the judge")
            second.start()
            second.join(15)
            assert not second.is_alive(), "the second delivery asked the judge too"
        finally:
            proxy.heal()
            first.join(120)
            if second.ident is not None:
                second.join(120)
    assert failed == []
    run.refresh_from_db()
    assert run.status == "done", run.error
    assert run.results.count() == run.texts


def test_the_embedded_web_process_marks_runs_its_last_stop_left_failed(
    make_user: Any, tmp_path: Path
) -> None:
    from tests.e2e.conftest import ControlPlane, wait_for

    loaded = evalrun.load_set("coding-ops")
    run = evalrun.begin(loaded, ["qwen3guard-0.6b"], surface="console", actor_name="t")
    web = ControlPlane(tmp_path)
    web.start()
    try:
        wait_for(
            lambda: EvalRun.objects.get(pk=run.pk).status == "failed", 30, "the run marked failed"
        )
    finally:
        web.stop()
    run.refresh_from_db()
    assert "the web process asking it stopped" in run.error
