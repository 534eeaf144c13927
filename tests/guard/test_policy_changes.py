"""The policy change log names each changed key as the file writes it (``judge.controversial``),
a single value with what it was and is."""

from __future__ import annotations

from guard.policy import changes


def test_nested_keys_are_named_and_values_shown() -> None:
    before = {"judge": {"models": ["a"], "controversial": "safe"}, "fail": "open"}
    after = {"judge": {"models": ["a", "b"], "controversial": "unsafe"}, "fail": "open"}
    assert changes(before, after) == ["judge.models", "judge.controversial: safe → unsafe"]
    assert changes(after, after) == []
    assert changes(None, {"fail": "closed"}) == ["fail"]
