"""Federation's pure core: peer names, a /v1/models answer read, the catalog changes a
refresh makes, and the breaker (LocalAI's figures: trip after 1 error in 30 s, 3 probes
to recover, 60 s dwell)."""

from __future__ import annotations

from catalog import spec
from gateway.path import federation as f


def test_peer_names_are_plain_and_hold_no_slash() -> None:
    assert f.name_problem("east") == "" and f.name_problem("eu-2") == ""
    for bad in ("", "East", "a/b", "-x", "a b", "x" * 64):
        assert "NAME/MODEL" in f.name_problem(bad)


def test_models_url_with_or_without_v1() -> None:
    assert f.models_url("https://p.example") == "https://p.example/v1/models"
    assert f.models_url("https://p.example/v1/") == "https://p.example/v1/models"


def test_listed_models_reads_ids_and_skips_what_is_no_name() -> None:
    body = {"data": [{"id": "chat"}, {"id": "c/other"}, {"id": "chat"}, {"id": 3}, {},
                     {"id": "bad\nname"}, {"id": "embed"}]}  # fmt: skip
    assert f.listed_models(body) == (["chat", "c/other", "embed"], "")
    assert f.listed_models({"object": "list"})[1] == "its /v1/models answer has no data list"
    assert f.listed_models([1])[0] == []


def test_plan_adds_removes_and_rewrites_a_peer_whose_address_changed() -> None:
    old = f.peer_model("b", "http://old:1", "k", "gone")
    kept = f.peer_model("b", "http://old:1", "k", "chat")
    p = f.plan("b", "http://new:1", "k", ["chat", "embed"], [old, kept])
    assert [m.name for m in p.add] == ["b/embed"]
    assert p.add[0].external == spec.External("http://new:1/v1", "embed", "k", "b")
    assert [m.name for m in p.change] == ["b/chat"]
    assert p.change[0].external.url == "http://new:1/v1"
    assert p.remove == ["b/gone"]
    assert not f.plan(
        "b", "http://new:1", "k", ["chat"], [f.peer_model("b", "http://new:1", "k", "chat")]
    )


def test_breaker_trips_on_one_error_and_returns_after_three_probes_and_the_dwell() -> None:
    t = f.Thresholds()
    h = f.probed(f.Health(), True, 0, t)
    assert h.state == f.UP
    h = f.probed(h, False, 10, t)
    assert h.state == f.TRIPPED and h.since == 10
    for now in (20, 30, 40):  # three passes, but inside the 60 s dwell
        h = f.probed(h, True, now, t)
    assert h.state == f.TRIPPED and h.passes == 3
    h = f.probed(h, False, 50, t)  # a failure starts the count again
    assert h.passes == 0
    for now in (60, 70):
        h = f.probed(h, True, now, t)
    assert h.state == f.TRIPPED
    h = f.probed(h, True, 80, t)
    assert h.state == f.UP and h.failures == ()


def test_breaker_counts_failures_within_its_window() -> None:
    t = f.Thresholds(errors=2, window=30)
    h = f.probed(f.Health(), False, 0, t)
    assert h.state == f.UP
    h = f.probed(h, False, 31, t)  # the first one is out of the window
    assert h.state == f.UP and h.failures == (31,)
    assert f.probed(h, False, 40, t).state == f.TRIPPED
