"""The guard's windows on a streamed answer: only judged text is released."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.path.holdback import Holdback


def test_nothing_with_text_leaves_before_a_window_allows_it() -> None:
    hold = Holdback(tokens=3, interval=10, margin=0)
    hold.add(b"role", "", 0)
    assert hold.releasable() == [b"role"]  # no text: nothing a judge has not read
    hold.add(b"a", "Hel", 0)
    hold.add(b"b", "lo", 0)
    assert hold.releasable() == []
    assert not hold.due(0)
    hold.add(b"c", " wor", 0)
    assert hold.due(0)
    ticket = hold.start()
    assert ticket.text == "Hello wor"
    hold.add(b"d", "ld", 0)  # arrives while the window is judged
    assert hold.releasable() == []
    hold.allow(ticket)
    assert hold.releasable() == [b"a", b"b", b"c"]
    assert hold.releasable() == []
    assert hold.unjudged


def test_a_phrase_cut_by_a_windows_end_waits_for_the_next_window() -> None:
    hold = Holdback(tokens=2, interval=10, margin=8)
    hold.add(b"a", "fine text ", 0)
    hold.add(b"b", "UNSAFE-", 0)
    ticket = hold.start()
    hold.allow(ticket)  # judged safe alone: its last 8 characters stay held
    assert hold.releasable() == []  # "fine text UNSAFE-" ends inside the margin
    hold.add(b"c", "MARKER", 0)
    hold.add(b"d", " more", 0)
    second = hold.start()
    assert "UNSAFE-MARKER" in second.text  # read whole in the next window
    hold.allow(second, final=True)
    assert hold.releasable() == [b"a", b"b", b"c", b"d"]


def test_a_window_is_due_by_time_as_well_as_by_tokens() -> None:
    hold = Holdback(tokens=100, interval=0.25, margin=0)
    assert hold.wait(10.0) is None
    hold.add(b"a", "x", 10.0)
    assert not hold.due(10.125)
    assert hold.wait(10.125) == 0.125
    assert hold.due(10.25)


def test_the_finish_chunk_waits_behind_unjudged_text() -> None:
    hold = Holdback(tokens=2, interval=10, margin=0)
    hold.add(b"a", "abc", 0)
    hold.add(b"finish", "", 0)
    hold.add(b"[DONE]", "", 0)
    assert hold.releasable() == []
    ticket = hold.start()
    hold.allow(ticket)
    assert hold.releasable() == [b"a", b"finish", b"[DONE]"]
    assert not hold.unjudged


@given(
    events=st.lists(st.tuples(st.binary(min_size=1, max_size=5), st.text(max_size=4)), max_size=60),
    steps=st.lists(st.sampled_from(["judge", "allow", "release"]), max_size=80),
    tokens=st.integers(1, 8),
    margin=st.integers(0, 6),
)
def test_released_events_never_carry_text_beyond_what_was_allowed(
    events: list[tuple[bytes, str]], steps: list[str], tokens: int, margin: int
) -> None:
    hold = Holdback(tokens=tokens, interval=1e9, margin=margin)
    allowed_upto = 0
    released: list[int] = []  # indexes of released events
    ticket = None
    texts = []
    step_iter = iter(steps)
    for i, (event, text) in enumerate(events):
        hold.add(bytes([i % 256]) + event, text, 0)
        texts.append(text)
        step = next(step_iter, "release")
        if step == "judge" and not hold.judging:
            ticket = hold.start()
        elif step == "allow" and ticket is not None:
            hold.allow(ticket)
            allowed_upto = max(allowed_upto, ticket.upto - margin)
            ticket = None
        out = hold.releasable()
        released.extend(range(len(released), len(released) + len(out)))
        # Everything released so far carries text within what judges allowed.
        assert sum(len(t) for t in texts[: len(released)]) <= allowed_upto
    assert hold.held_bytes >= 0


def test_held_bytes_count_what_waits() -> None:
    hold = Holdback(tokens=1, interval=10)
    hold.add(b"12345", "x", 0)
    assert hold.held_bytes == 5
    hold.allow(hold.start(), final=True)
    hold.releasable()
    assert hold.held_bytes == 0
