"""The update flow's pure core (updates.flow): the plan, each step's decision, the catalog
it leaves. Over plain data; the candidates and promoted models are checked by the
catalog's own rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from catalog import codec, rules, spec
from tests.catalog.samples import sim_model
from updates import flow
from updates.flow import Facts

OLD = "a" * 40
NEW = "b" * 40


def model(**extra: object) -> spec.Model:
    weights = {"path": "sim-weights.json", "sha256": "1" * 64, "bytes": 10}
    m, problems = codec.decode_model(sim_model(
        "chat", 2, most=4, gpu_class="nvidia-l4-24gb", aliases=["assistant"], source="acme/chat",
        origin={"repo": "acme/chat", "revision": OLD, "files": [weights]},
    ))  # fmt: skip
    assert m is not None and not problems, problems
    for k, v in extra.items():
        setattr(m, k, v)
    return m


NEW_REV = flow.Revision(NEW, (spec.OriginFile("sim-weights.json", "2" * 64, 12),))


def running(model_name: str = "chat") -> flow.Running:
    return flow.Running(7, model_name, flow.EVAL, flow.RUNNING, "alice", "12:00 UTC")


# -- the plan ------------------------------------------------------------------------------


def test_a_plain_model_fetches_starts_a_candidate_and_promotes() -> None:
    p = flow.plan(model())
    assert p.steps == (flow.FETCH, flow.CANDIDATE, flow.PROMOTE)
    assert p.canary is None and not p.auto


def test_eval_and_canary_add_their_steps() -> None:
    m = model(eval=spec.EvalGate("arithmetic", 0.8, "judge"),
              canary=spec.Canary("other", 0, min_requests=20))  # fmt: skip
    p = flow.plan(m, auto=True)
    assert p.steps == (flow.FETCH, flow.CANDIDATE, flow.EVAL, flow.CANARY, flow.PROMOTE)
    assert (p.suite, p.min_score, p.judge, p.auto) == ("arithmetic", 0.8, "judge", True)
    assert p.canary == flow.CanarySettings(10, 20)


def test_a_canary_percent_given_at_start_is_used_and_zero_means_none() -> None:
    assert flow.plan(model(), canary_percent=30).canary == flow.CanarySettings(30)
    m = model(canary=spec.Canary("other", 0, max_error_increase=0.1))
    assert flow.plan(m, canary_percent=50).canary == flow.CanarySettings(50, 0, 0.1)
    assert flow.CANARY not in flow.plan(m, canary_percent=0).steps


def test_a_second_update_of_a_model_is_refused_naming_the_first() -> None:
    with pytest.raises(flow.FlowRefused) as caught:
        flow.plan(model(), [running("other"), running("chat")])
    said = str(caught.value)
    assert "#7" in said and "alice" in said and "eval" in said
    flow.plan(model(), [running("other")])  # another model's does not count


@pytest.mark.parametrize(
    ("extra", "kwargs", "said"),
    [
        ({"name": "chat@bbbbbbbb"}, {}, "is an update's candidate"),
        ({"external": spec.External(url="https://x", model="m")}, {}, "external model"),
        ({}, {"has_registry": False}, "no registry"),
        ({"canary": spec.Canary("other", 20)}, {}, "sends 20% of its traffic"),
        ({}, {"canary_percent": 101}, "canary percent 101 is not 0 to 100"),
    ],
)
def test_an_update_that_cannot_be_is_refused_saying_why(extra, kwargs, said) -> None:
    with pytest.raises(flow.FlowRefused, match=said):
        flow.plan(model(**extra), **kwargs)


# -- the decisions -------------------------------------------------------------------------


FULL = flow.plan(
    model(eval=spec.EvalGate("arithmetic"), canary=spec.Canary("x", 0, min_requests=10)),
)


def test_fetch_goes_on_when_done_and_fails_with_the_mirrors_reason() -> None:
    assert flow.decide(FULL, flow.FETCH, Facts(fetch_state="fetching")).action == "stay"
    assert flow.decide(FULL, flow.FETCH, Facts(fetch_state="done")) == flow.Decision(
        "go", flow.CANDIDATE, "fetched into the mirror"
    )
    failed = flow.decide(FULL, flow.FETCH, Facts(fetch_state="failed", fetch_reason="disk full"))
    assert (failed.action, failed.line) == ("fail", "fetch failed: disk full")


def test_a_candidate_with_no_room_waits_saying_why_and_a_failed_one_fails() -> None:
    waiting = flow.decide(FULL, flow.CANDIDATE, Facts(candidate_waiting="no node has a free L4"))
    assert (waiting.action, waiting.line) == ("stay", "no node has a free L4")
    failed = flow.decide(FULL, flow.CANDIDATE, Facts(candidate_failed="exit 1"))
    assert failed.action == "fail" and failed.remove_candidate
    assert flow.decide(FULL, flow.CANDIDATE, Facts(candidate_ready=True)).step == flow.EVAL


def test_an_eval_below_its_threshold_fails_naming_the_cases_and_removes_the_candidate() -> None:
    facts = Facts(eval_done=True, score=0.5, threshold=0.9, failed_cases=("sum-1", "product-3"))
    d = flow.decide(FULL, flow.EVAL, facts)
    assert d.action == "fail" and d.remove_candidate
    assert d.line == "eval arithmetic: score 0.50, below 0.90; failed: sum-1, product-3"
    passed = flow.decide(FULL, flow.EVAL, Facts(eval_done=True, score=0.9, threshold=0.9))
    assert (passed.action, passed.step) == ("go", flow.CANARY)


def test_many_failed_cases_are_cut_to_twenty_and_counted() -> None:
    cases = tuple(f"c{i}" for i in range(25))
    d = flow.decide(
        FULL, flow.EVAL, Facts(eval_done=True, score=0, threshold=1, failed_cases=cases)
    )
    assert d.line.endswith("c19 and 5 more")


def test_a_canary_rolled_back_fails_with_the_gateways_figures() -> None:
    why = "canary chat@bbbbbbbb rolled back: error rate 50% vs 0% over 20 requests"
    d = flow.decide(FULL, flow.CANARY, Facts(canary_on=False, canary_why=why))
    assert (d.action, d.line, d.remove_candidate) == ("fail", why, True)


@given(st.integers(0, 200), st.integers(1, 100), st.floats(0, 30))
def test_a_canary_passes_only_past_min_requests_and_settled(
    served: int, least: int, settled: float
) -> None:
    d = flow.decide(
        FULL, flow.CANARY, Facts(served=served, min_requests=least, settled_for=settled)
    )
    passed = served >= least and settled >= flow.CANARY_SETTLE_S
    assert d.action == ("wait" if passed else "stay")


def test_after_the_last_gate_an_auto_update_promotes_and_another_waits() -> None:
    plain = flow.plan(model())
    assert flow.decide(plain, flow.CANDIDATE, Facts(candidate_ready=True)).action == "wait"
    auto = flow.plan(model(), auto=True)
    assert flow.decide(auto, flow.CANDIDATE, Facts(candidate_ready=True)).action == "promote"


@given(st.sampled_from(flow.STEPS), st.booleans(), st.booleans(), st.floats(0, 1), st.booleans())
def test_every_decision_names_a_step_of_the_plan(step, ready, done, score, on) -> None:
    facts = Facts(fetch_state="done" if done else "queued", candidate_ready=ready,
                  eval_done=done, score=score, threshold=0.5, canary_on=on)  # fmt: skip
    d = flow.decide(FULL, step, facts)
    assert d.step in FULL.steps
    assert isinstance(d.action, flow.Action)
    if d.action == "go":
        assert FULL.steps.index(d.step) == FULL.steps.index(step) + 1


# -- the catalog it leaves -------------------------------------------------------------------


def check(*models: spec.Model) -> list[str]:
    return [p.message for p in rules.check_catalog(list(models))]


def test_the_candidate_is_the_model_at_the_new_revision_with_one_replica() -> None:
    m = model(eval=spec.EvalGate("arithmetic"), fallbacks=[])
    c = flow.candidate_spec(m, NEW_REV)
    assert c.name == "chat@bbbbbbbb" and flow.is_candidate(c.name)
    assert (c.aliases, c.canary, c.eval, c.fallbacks) == ([], None, None, [])
    assert (c.scaling.min, c.scaling.max) == (1, 1)
    assert c.profiles == m.profiles and c.source == m.source
    assert c.origin == spec.Origin("acme/chat", NEW, list(NEW_REV.files))
    canaried = flow.with_canary(m, c.name, flow.CanarySettings(25, 10))
    assert check(canaried, c) == []
    assert canaried.canary == spec.Canary(c.name, 25, 10)
    assert m.canary is None  # the model given is not changed


def test_promote_keeps_the_old_revision_as_previous_and_drops_the_canary() -> None:
    m = flow.with_canary(model(), "chat@bbbbbbbb", flow.CanarySettings(10))
    out = flow.promoted_spec(m, "chat@bbbbbbbb", NEW_REV)
    assert out.canary is None
    assert out.origin.revision == NEW and out.origin.files == list(NEW_REV.files)
    assert out.origin.previous == spec.PreviousOrigin("acme/chat", OLD, model().origin.files)
    # The candidate takes the model's traffic while it rolls, then is taken off.
    assert out.fallbacks == ["chat@bbbbbbbb"]
    after = flow.without_handover(out, "chat@bbbbbbbb")
    assert after.fallbacks == [] and check(after) == []


def test_rollback_returns_to_previous_and_keeps_the_current_as_previous() -> None:
    promoted = flow.promoted_spec(model(), "x", NEW_REV)
    back = flow.rollback_spec(promoted)
    assert back.origin.revision == OLD
    assert back.origin.previous.revision == NEW
    assert flow.rollback_spec(back).origin.revision == NEW  # and forth again
    with pytest.raises(flow.FlowRefused, match="no previous revision"):
        flow.rollback_spec(model())


@given(st.text("0123456789abcdef", min_size=8, max_size=40))
def test_promote_then_rollback_is_where_it_started(commit: str) -> None:
    new = flow.Revision(commit, ())
    back = flow.rollback_spec(flow.promoted_spec(model(), "x", new))
    assert back.origin.revision == OLD and back.origin.files == model().origin.files
    assert back.source == model().source


def test_a_rollback_to_the_revision_it_is_at_is_refused() -> None:
    m = model()
    m.origin.previous = spec.PreviousOrigin("acme/chat", m.origin.revision, m.origin.files)
    with pytest.raises(flow.FlowRefused, match="its previous revision is the one it is at"):
        flow.rollback_spec(m)
    # A promote to the revision it is at keeps what it came from.
    again = flow.promoted_spec(model(), "x", flow.Revision(model().origin.revision, ()))
    assert again.origin.previous == model().origin.previous
