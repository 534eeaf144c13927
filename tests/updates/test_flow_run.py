"""The update flow's shell (updates.run) over the database, the mirror against the Hub
stand-in (the real huggingface_hub), and the gateway's own canary rollback: each step,
each way it ends, promote, rollback. The eval through a gateway is proved end to end
(tests/e2e/test_updates.py); here its result is what the eval task writes."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from catalog.models import ChangeRecord, ServedModel
from catalog.services import Actor, save_model, stored_specs
from catalog.spec import EvalGate
from cluster.models import Replica
from gateway.models import Usage
from gateway.records.watch import roll_back
from tests.catalog.samples import gpu_model, store
from tests.updates.hubstandin import HubStandIn
from updates import cli, flow, mirror, run
from updates.models import Fetch, UpdateRun

pytestmark = pytest.mark.django_db

V1 = b'{"llmgw-sim-weights": 1, "name": "v1"}' + b" " * 1000
V2 = b'{"llmgw-sim-weights": 1, "name": "v2"}' + b" " * 1000


def spec(name: str = "chat") -> Any:
    found = stored_specs(names=[name])
    return found[0] if found else None


@pytest.fixture
def chat(hub: HubStandIn) -> str:
    """Model chat at v1 of org/chat (fetched, origin written), with a ready replica; v2
    committed to the repository since."""
    first = hub.commit("org/chat", {"model.safetensors": V1, "README.md": b"v1"})
    store(gpu_model("chat"))
    f = mirror.request_fetch("chat", by="test", surface="cli", start=False)
    assert mirror.run_fetch(f.pk).state == "done"
    assert spec().origin.revision == first
    served = ServedModel.objects.get(name="chat")
    Replica.objects.create(model=served, model_name="chat", state="ready")
    return hub.commit("org/chat", {"model.safetensors": V2, "README.md": b"v2"})


def fetched(r: UpdateRun) -> UpdateRun:
    """Run the update's fetch (the worker's part) and look once."""
    assert mirror.run_fetch(r.fetch_id).state == "done"
    out = run.advance(r.pk)
    assert out is not None
    return out


def ready(r: UpdateRun) -> UpdateRun:
    """Make the candidate's replica ready (its agent's report) and look once."""
    served = ServedModel.objects.get(name=r.candidate)
    Replica.objects.create(model=served, model_name=r.candidate, state="ready")
    out = run.advance(r.pk)
    assert out is not None
    return out


def replaced(r: UpdateRun) -> None:
    """Make a promote's replacements ready (their agents' reports) and look once: the
    candidate stops taking the model's traffic."""
    r.refresh_from_db()
    Replica.objects.filter(pk__in=r.handover).update(state="ready")
    run.end_handovers()
    r.refresh_from_db()
    assert r.handover_ended is not None
    assert r.candidate not in spec(r.model).fallbacks


def test_an_update_fetches_starts_a_candidate_and_waits_then_promote_rolls(chat: str) -> None:
    r = run.start("chat", surface="cli", via="ops@host")
    assert (r.state, r.step, r.started_by, r.surface) == (
        "running",
        "fetch",
        "system (ops@host)",
        "cli",
    )
    r = fetched(r)
    assert (r.step, r.commit, r.candidate) == ("candidate", chat, f"chat@{chat[:8]}")
    candidate = spec(r.candidate)
    assert candidate.origin.revision == chat and candidate.scaling.min == 1
    assert spec().origin.revision != chat  # the model is untouched until promoted
    r = ready(r)
    assert (r.state, r.step) == ("waiting", "promote")
    assert "ready to promote" in r.lines[-1]["text"]
    old_replica = Replica.objects.get(model_name="chat")

    promoted = run.promote("chat", surface="cli", via="ops@host")
    assert promoted.state == "promoted"
    m = spec()
    assert m.origin.revision == chat
    assert m.origin.previous.revision == r.from_commit
    assert [f.path for f in m.origin.files] == ["model.safetensors"]
    assert spec().canary is None and spec(r.candidate) is not None  # drained first
    assert spec().fallbacks == [r.candidate]  # until its replacement is ready
    assert run.sweep(timezone.now() + timedelta(seconds=run.DRAIN_S)) == []
    replaced(promoted)
    assert spec().fallbacks == []
    assert run.sweep() == []
    assert run.sweep(timezone.now() + timedelta(seconds=run.DRAIN_S)) == [r.candidate]
    assert spec(r.candidate) is None  # the candidate went away
    assert Replica.objects.filter(model_name="chat", replaces=old_replica).count() == 1
    log = ChangeRecord.objects.filter(model_name="chat", summary__contains="promoted to").first()
    assert log is not None and "ops@host" in log.actor_name

    said = run.rollback("chat", surface="cli", via="ops@host")
    assert said.startswith(f"chat is back at {r.from_commit[:8]}")
    assert spec().origin.revision == r.from_commit
    assert spec().origin.previous.revision == chat


def test_rollback_says_so_when_the_mirror_no_longer_holds_the_previous_revision(chat: str) -> None:
    r = ready(fetched(run.start("chat", auto=True)))
    assert r.state == "promoted"
    held = mirror.local_path("chat", r.from_commit)
    assert held is not None
    shutil.rmtree(held)
    with pytest.raises(flow.FlowRefused, match=f"no longer holds chat at {r.from_commit[:8]}"):
        run.rollback("chat")
    assert spec().origin.revision == chat  # nothing changed


def test_a_second_update_is_refused_naming_the_first(chat: str) -> None:
    first = run.start("chat", via="alice@host")
    with pytest.raises(flow.FlowRefused, match=f"#{first.pk}, started by system \\(alice@host\\)"):
        run.start("chat")
    assert UpdateRun.objects.count() == 1


def test_an_update_to_the_revision_it_is_at_is_refused_saying_so(chat: str) -> None:
    at = spec().origin.revision
    with pytest.raises(
        flow.FlowRefused, match=f"chat is at {at[:8]} already, {at}: nothing to update to"
    ):
        run.start("chat", revision=at)
    with pytest.raises(flow.FlowRefused, match="has no revision ffff"):
        run.start("chat", revision="f" * 40)
    assert UpdateRun.objects.count() == 0


def test_an_eval_below_its_threshold_fails_names_the_cases_and_removes_the_candidate(
    chat: str,
) -> None:
    m = spec()
    m.eval = EvalGate(suite="arithmetic", min_score=0.9)
    save_model(m, Actor(user=None, surface="cli", name="test"), replacing="chat")
    r = ready(fetched(run.start("chat")))
    assert r.step == "eval" and r.eval_started is not None
    # What the eval task writes at its end (updates.run.run_eval).
    UpdateRun.objects.filter(pk=r.pk).update(
        score=0.5,
        threshold=0.9,
        failed_cases=[{"case": "sum-1", "answer": "758", "why": "expected 757"}],
    )
    r = run.advance(r.pk)
    assert r.state == "failed"
    assert r.reason == "eval arithmetic: score 0.50, below 0.90; failed: sum-1"
    assert spec(r.candidate) is None and spec().canary is None


def test_a_canary_the_gateway_rolls_back_fails_the_update_with_its_figures(chat: str) -> None:
    r = ready(fetched(run.start("chat", canary_percent=50)))
    assert r.step == "canary"
    assert spec().canary.model == r.candidate and spec().canary.percent == 50
    why = f"canary {r.candidate} rolled back: error rate 50% vs 0% over 50 requests"
    assert roll_back("chat", r.candidate, why)  # the gateway's own write
    r = run.advance(r.pk)
    assert (r.state, r.reason) == ("failed", why)
    assert spec().canary is None
    assert run.sweep(timezone.now() + timedelta(seconds=run.DRAIN_S)) == [r.candidate]
    assert spec(r.candidate) is None


def test_a_canary_past_min_requests_and_settled_passes_and_auto_promotes(chat: str) -> None:
    r = ready(fetched(run.start("chat", canary_percent=20, auto=True)))
    minute = timezone.now().replace(second=0, microsecond=0)
    Usage.objects.create(minute=minute, key="app", model=r.candidate, requests=30)
    r = run.advance(r.pk)
    assert (r.state, r.canary["served"]) == ("running", 30)  # below the default 50
    Usage.objects.filter(model=r.candidate).update(requests=60)
    r = run.advance(r.pk)
    assert r.state == "running" and r.canary_reached is not None  # not settled yet
    UpdateRun.objects.filter(pk=r.pk).update(canary_reached=timezone.now() - timedelta(seconds=10))
    r = run.advance(r.pk)
    assert r.state == "promoted" and spec().canary is None


def test_a_fetch_that_fails_fails_the_update_with_the_mirrors_reason(
    chat: str, hub: HubStandIn
) -> None:
    r = run.start("chat")
    hub.delete("org/chat")
    r = fetched_or_failed(r)
    assert r.state == "failed" and r.reason.startswith("fetch failed: ")
    assert spec().origin.revision != chat


def fetched_or_failed(r: UpdateRun) -> UpdateRun:
    mirror.run_fetch(r.fetch_id)
    out = run.advance(r.pk)
    assert out is not None
    return out


@pytest.mark.parametrize(
    ("model", "kwargs", "said"),
    [
        ("nope", {}, 'model "nope" is not in the catalog'),
        ("local", {}, "there is no registry to update it from"),
        ("chat", {"canary_percent": 150}, "canary percent 150"),
    ],
)
def test_an_update_that_cannot_start_changes_nothing(
    chat: str, model: str, kwargs, said: str
) -> None:
    store(gpu_model("local", source="/models/local.gguf"))
    before = Fetch.objects.count()
    with pytest.raises(flow.FlowRefused, match=said):
        run.start(model, **kwargs)
    assert UpdateRun.objects.count() == 0 and Fetch.objects.count() == before


def test_the_command_starts_promotes_and_refuses_in_one_line(chat: str) -> None:
    out, err = Lines(), Lines()
    assert cli.handle("start", {"model": "chat"}, out, err) == 0
    assert out.lines[0].startswith("update #") and "fetching" in out.lines[0]
    assert cli.handle("start", {"model": "chat"}, out, err) == 1
    assert "is running already" in err.lines[-1]
    assert cli.handle("promote", {"model": "chat"}, out, err) == 1
    assert "not ready to promote yet" in err.lines[-1]
    assert cli.handle("status", {"models": ["chat"], "json": True}, out, err) == 0
    assert '"state": "running"' in out.lines[-1]


class Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, text: str) -> None:
        self.lines.append(text)


def test_manage_py_catalog_update_start_status_and_a_refusal(chat: str) -> None:  # noqa: F811
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("catalog", "update", "start", "chat", "--canary", "20", stdout=out)
    assert out.getvalue().startswith("update #") and "fetching" in out.getvalue()
    r = UpdateRun.objects.get()
    assert r.surface == "cli" and flow.CANARY in r.plan["steps"]
    out = StringIO()
    call_command("catalog", "update", "status", "chat", "--json", stdout=out)
    assert json.loads(out.getvalue())["state"] == "running"
    err = StringIO()
    with pytest.raises(SystemExit) as code:
        call_command("catalog", "update", "rollback", "chat", stderr=err)
    assert code.value.code == 1 and f"update #{r.pk} of chat is running" in err.getvalue()


def test_cancel_ends_a_running_update_and_removes_its_candidate(chat: str) -> None:  # noqa: F811
    with pytest.raises(flow.FlowRefused, match='no update of "chat" is running'):
        run.cancel("chat")
    r = fetched(run.start("chat", canary_percent=30))
    assert spec(r.candidate) is not None
    r = run.cancel("chat", surface="cli", via="ops@host")
    assert (r.state, r.reason, r.ended_by) == (
        "failed",
        "cancelled by system (ops@host)",
        "system (ops@host)",
    )
    assert spec(r.candidate) is None and spec().canary is None
    run.start("chat")  # the next one may start


def test_an_eval_that_never_ends_fails_the_update_past_its_limit(chat: str) -> None:  # noqa: F811
    m = spec()
    m.eval = EvalGate(suite="arithmetic")
    save_model(m, Actor(user=None, surface="cli", name="test"), replacing="chat")
    r = ready(fetched(run.start("chat")))
    assert r.step == "eval"
    assert run.advance(r.pk).state == "running"
    UpdateRun.objects.filter(pk=r.pk).update(
        eval_started=timezone.now() - timedelta(seconds=run.EVAL_LIMIT_S + 1)
    )
    r = run.advance(r.pk)
    assert r.state == "failed" and "did not end within 60 minutes" in r.reason


def test_a_candidate_with_no_room_waits_saying_why(chat: str) -> None:  # noqa: F811
    r = fetched(run.start("chat"))
    served = ServedModel.objects.get(name=r.candidate)
    why = "no room: no node has a free nvidia-h100-80gb (n1: 2 of 2 cards taken by chat)"
    Replica.objects.create(model=served, model_name=r.candidate, state="pending", reason=why)
    r = run.advance(r.pk)
    assert (r.state, r.step) == ("running", "candidate")
    assert r.lines[-1]["text"] == f"candidate {r.candidate}: {why}"
    assert run.advance(r.pk).lines == r.lines  # said once, not a line a look


def test_an_eval_below_its_threshold_cannot_be_promoted_by_hand(chat: str) -> None:  # noqa: F811
    m = spec()
    m.eval = EvalGate(suite="arithmetic", min_score=0.9)
    save_model(m, Actor(user=None, surface="cli", name="test"), replacing="chat")
    r = ready(fetched(run.start("chat")))
    UpdateRun.objects.filter(pk=r.pk).update(score=0.5, threshold=0.9)
    with pytest.raises(flow.FlowRefused, match="scored 0.50, below 0.90"):
        run.promote("chat")


def test_an_update_to_a_revision_gone_back_from_keeps_its_candidate(chat: str) -> None:
    # Promoted to v2, rolled back to v1, then updated to v2 again: the second update's
    # candidate has the first's name, and the first's ending must leave it alone (found
    # in a walk: the first update's sweep deleted it every tick, and the second waited
    # for a replica for ever).
    first = ready(fetched(run.start("chat", surface="cli")))
    run.promote("chat", surface="cli")
    replaced(first)
    later = timezone.now() + timedelta(seconds=run.DRAIN_S)
    assert run.sweep(later) == [first.candidate]
    run.rollback("chat", surface="cli")
    again = fetched(run.start("chat", surface="cli"))
    assert again.candidate == first.candidate and spec(again.candidate) is not None
    assert run.sweep(later + timedelta(hours=1)) == []
    again = ready(again)
    assert again.state == "waiting" and spec(again.candidate) is not None
    # Once it ends, its own drain decides.
    run.promote("chat", surface="cli")
    replaced(again)
    assert run.sweep() == []
    assert run.sweep(timezone.now() + timedelta(seconds=run.DRAIN_S)) == [again.candidate]


def test_a_candidate_removed_from_the_catalog_fails_its_update(chat: str) -> None:
    # An import with --replace of a file that does not list it, or a delete by hand:
    # the update ends saying so, rather than waiting for a replica for ever.
    from catalog.services import delete_model

    r = fetched(run.start("chat", surface="cli"))
    assert r.step == "candidate"
    delete_model(r.candidate, Actor(user=None, surface="cli", name="ops"))
    r = run.advance(r.pk)
    assert r is not None and r.state == "failed"
    assert f"the candidate failed: {r.candidate} was removed from the catalog" in r.reason
    assert spec().origin.revision != chat  # the model as it was


def test_the_last_check_follows_a_promote_and_a_rollback(chat: str) -> None:
    # The walk found the panel still saying "update available: weights at <v2>" after
    # the model was promoted to v2. Promoted, the check says current; rolled back, what
    # v2 changes again; its time and who checked stay (the registry was not asked again).
    from updates import checking

    [checked] = checking.check_models(["chat"], by="ops (command line)")
    assert (checked.state, checked.latest, checked.changed) == (
        "available", chat, ["model.safetensors"])  # fmt: skip
    when = checking.last_checks(["chat"])["chat"].checked
    ready(fetched(run.start("chat", surface="cli")))
    run.promote("chat", surface="cli")
    last = checking.last_checks(["chat"])["chat"]
    assert (last.state, last.revision, last.latest, last.changed) == ("current", chat, chat, [])
    assert last.message == f"at {chat[:8]}, the newest"  # the badge says "up to date"
    assert last.checked == when and last.checked_by == "ops (command line)"
    run.rollback("chat", surface="cli")
    last = checking.last_checks(["chat"])["chat"]
    assert (last.state, last.latest, last.changed) == ("available", chat, ["model.safetensors"])
    assert last.revision == spec().origin.revision != chat


@pytest.mark.parametrize(
    ("started_by", "surface", "shown"),
    [
        ("alice (console)", "console", "alice (console)"),
        ("alice (api, token ci)", "api", "alice (api, token ci)"),
        ("alice (admin)", "admin", "alice (admin)"),
        ("system (ops@host)", "cli", "system (ops@host) (command line)"),
        ("", "", "the system"),
    ],
)
def test_who_started_an_update_is_said_once(started_by: str, surface: str, shown: str) -> None:
    # The walk found "started by admin (console) (console)".
    assert UpdateRun(started_by=started_by, surface=surface).started_through == shown


def test_an_update_of_a_model_never_fetched_writes_its_origin_at_promote_only(
    hub: HubStandIn,
) -> None:
    # A sim engine's model: its nodes need no weights, so nothing fetched it before.
    commit = hub.commit("org/sim", {"sim-weights.json": V1})
    store(gpu_model("sim"))
    served = ServedModel.objects.get(name="sim")
    Replica.objects.create(model=served, model_name="sim", state="ready")
    r = fetched(run.start("sim"))
    assert r.step == "candidate"
    assert spec("sim").origin is None  # the update's fetch is not what serves
    r = ready(r)
    assert r.state == "waiting"
    assert spec("sim").origin is None
    run.promote("sim")
    m = spec("sim")
    assert m.origin.revision == commit and m.origin.previous is None
    # Nothing to go back to: refused naming why, and no replica rolled.
    before = set(Replica.objects.values_list("pk", flat=True))
    with pytest.raises(flow.FlowRefused, match="no previous revision to go back to: it is at"):
        run.rollback("sim")
    assert set(Replica.objects.values_list("pk", flat=True)) == before
    assert spec("sim").origin.revision == commit


def test_a_rollback_with_no_origin_is_refused_naming_why(hub: HubStandIn) -> None:
    hub.commit("org/sim", {"sim-weights.json": V1})
    store(gpu_model("sim"))
    with pytest.raises(flow.FlowRefused, match="it has no origin"):
        run.rollback("sim")


def test_the_steps_that_act_as_they_start_are_the_candidate_the_eval_and_the_canary() -> None:
    assert set(run.ENTRY) == {flow.CANDIDATE, flow.EVAL, flow.CANARY}
    assert set(run.ENTRY) < set(flow.STEPS)
