"""Test fitting long judged texts into a judge's context, with pure counters.

The counters are the sim engine's own tokenizer (``agent.simtext.tokenize``, what its
/tokenize answers), a byte counter, and an uneven one whose tokens are dense at one end
of a text and sparse at the other, so that cutting by characters misjudges the tokens.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.simtext import tokenize
from guard import formats
from guard.formats import neutralise
from guard.longtext import (
    MIN_SHARE,
    Fitted,
    TooSmall,
    estimate_tokens,
    fit,
    marker,
    share,
    shorten,
)

CUT_RE = re.compile(r"\n\[… (\d+) characters cut …\]\n")


def sim_count(text: str) -> int:
    """Count tokens as the sim engine's /tokenize does (special tokens parsed)."""
    return len(tokenize(text))


def byte_count(text: str) -> int:
    """Count a token per UTF-8 byte, the most a byte-level tokenizer makes."""
    return len(text.encode("utf-8"))


def uneven_count(text: str) -> int:
    """Count punctuation a token per character and letters a token per eight."""
    letters = sum(1 for c in text if c.isalnum())
    return (len(text) - letters) + (letters + 7) // 8


COUNTERS = {"sim": sim_count, "bytes": byte_count, "uneven": uneven_count}

# Pieces that stress a template: special tokens, turn labels, markers of our own,
# whitespace runs, characters that normalise to more, and the sim's unsafe marker.
FRAGMENTS = (
    "<|im_end|>",
    "<|eot_id|>",
    "<end_of_turn>",
    "\nUSER: ",
    "\n\nASSISTANT: ",
    "Safety: Unsafe",
    "<END CONVERSATION>",
    "[… 3 characters cut …]",
    "\n\n",
    "   ",
    "!!!!",
    "\ufdfa",
    "é",
    "日本語",
    "🙂",
    " word",
    " the model answers",
    "{request}",
)
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=12)), max_size=120).map(
    "".join
)


def renderer(name: str, categories: tuple[str, ...] | None = None) -> Callable[..., str]:
    """Return a format's render as fit() calls it: the texts in, the prompt text out."""
    fmt = formats.get(name)

    def render(request: str, answer: str | None) -> str:
        return fmt.render(
            request, answer, categories=categories, for_raw_completion=fmt.raw_completion
        )

    return render


RENDERS = {
    "qwen3guard": renderer("qwen3guard"),
    "llamaguard3": renderer("llamaguard3"),
    "shieldgemma": renderer("shieldgemma", ("Dangerous Content",)),
    "json": renderer("json"),
}


def check_fitted(
    fitted: Fitted,
    render: Callable[..., str],
    count: Callable[[str], int],
    request: str,
    answer: str | None,
    budget: int,
) -> None:
    """Assert what fit() promises: it fits, it is what was counted, cut texts keep their ends."""
    assert fitted.tokens == count(fitted.prompt) <= budget
    assert fitted.prompt == render(fitted.request, fitted.answer)
    pairs = [(request, fitted.request)]
    if answer is not None:
        pairs.append((answer, fitted.answer))
    else:
        assert fitted.answer is None
    assert fitted.cut == any(old != new for old, new in pairs)
    for old, new in pairs:
        if old == new:
            continue
        assert isinstance(new, str)
        found = CUT_RE.search(new)
        assert found is not None
        head, tail = new[: found.start()], new[found.end() :]
        assert head and tail
        assert old.startswith(head) and old.endswith(tail)
        assert len(head) + int(found.group(1)) + len(tail) == len(old)


# -- the estimate ------------------------------------------------------------------------


@given(st.text())
@example("!!!!!!!!")
@example("\ufdfa" * 10)
@example("<|im_end|>" * 3)
def test_the_estimate_is_never_below_the_sim_tokenizer(text: str) -> None:
    assert estimate_tokens(text) >= len(tokenize(text, parse_special=False))
    assert estimate_tokens(text) >= sim_count(text)


@given(st.text())
def test_the_estimate_covers_every_normalisation_a_tokenizer_may_apply(text: str) -> None:
    for form in ("NFC", "NFKC"):
        normalised = unicodedata.normalize(form, text)
        assert estimate_tokens(text) > len(normalised.encode("utf-8"))


def test_the_estimate_counts_a_character_that_normalises_to_eighteen() -> None:
    # U+FDFA is 3 bytes; NFKC writes it as 18 characters, 33 bytes.
    assert estimate_tokens("\ufdfa") == 34
    assert estimate_tokens("ab") == 3


def test_the_estimate_takes_a_lone_surrogate() -> None:
    assert estimate_tokens("a\ud800b") == 6


# -- sharing the room ----------------------------------------------------------------------


@given(
    st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=2),
    st.integers(min_value=-100, max_value=20_000),
)
def test_share_keeps_within_the_room_and_gives_each_its_minimum(
    sizes: list[int], room: int
) -> None:
    kept = share(sizes, room)
    if sum(sizes) <= room:
        assert kept == sizes
        return
    assert sum(kept) <= max(room, 0)
    floor = int(max(room, 0) * MIN_SHARE)
    for size, keep in zip(sizes, kept, strict=True):
        assert min(size, floor) <= keep <= size


def test_a_short_request_is_kept_whole_beside_a_long_answer() -> None:
    assert share([50, 5000], 1000) == [50, 950]


def test_two_long_texts_share_in_proportion_beyond_their_quarter() -> None:
    # Each gets 250, then the 500 left goes 1:3 to what each still lacks.
    assert share([1250, 3250], 1000) == [250 + 125, 250 + 375]


def test_share_refuses_minimums_beyond_the_room() -> None:
    with pytest.raises(ValueError):
        share([10, 10, 10], 5, min_share=0.5)


# -- cutting one text ----------------------------------------------------------------------


@given(st.text(min_size=3), st.integers(min_value=0, max_value=500))
def test_shorten_keeps_both_ends_and_names_the_cut(text: str, keep: int) -> None:
    size = sim_count(text)
    short = shorten(text, keep, size)
    if keep >= size or short == text:
        assert short == text
        return
    found = CUT_RE.search(short)
    assert found is not None
    head, tail = short[: found.start()], short[found.end() :]
    assert text.startswith(head) and text.endswith(tail)
    assert head[0] == text[0] and tail[-1] == text[-1]
    assert len(head) + int(found.group(1)) + len(tail) == len(text)


def test_the_marker_passes_the_formats_neutralising_unchanged() -> None:
    assert neutralise(marker(12345)) == marker(12345)
    assert neutralise("USER: a" + marker(7) + "ASSISTANT: b").count(marker(7)) == 1


# -- fitting a prompt ----------------------------------------------------------------------


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(RENDERS)),
    st.sampled_from(sorted(COUNTERS)),
    texts,
    st.one_of(st.none(), texts),
    st.integers(min_value=0, max_value=2500),
)
def test_the_prompt_always_fits_and_keeps_the_ends(
    name: str, counter: str, request: str, answer: str | None, extra: int
) -> None:
    render, count = RENDERS[name], COUNTERS[counter]
    # The budget runs from the bare template (texts empty) to well past the whole.
    budget = count(render("", None if answer is None else "")) + extra
    try:
        fitted = fit(render, count, request, answer, budget=budget)
    except TooSmall as error:
        # Only when even a character at each end cannot fit.
        least = [
            t if len(t) <= 2 else t[0] + marker(len(t) - 2) + t[-1]
            for t in [request, answer]
            if t is not None
        ]
        bare = render(least[0], least[1] if answer is not None else None)
        assert count(bare) > budget
        assert error.budget == budget
        return
    check_fitted(fitted, render, count, request, answer, budget)


@given(st.sampled_from(sorted(RENDERS)), texts, st.one_of(st.none(), texts))
def test_a_prompt_that_fits_is_untouched(name: str, request: str, answer: str | None) -> None:
    render = RENDERS[name]
    whole = render(request, answer)
    fitted = fit(render, sim_count, request, answer, budget=sim_count(whole))
    assert fitted == Fitted(whole, sim_count(whole), request, answer, False)


@pytest.mark.parametrize("counter", sorted(COUNTERS))
@pytest.mark.parametrize("name", sorted(RENDERS))
def test_a_long_text_keeps_its_start_its_end_and_the_marker(name: str, counter: str) -> None:
    render, count = RENDERS[name], COUNTERS[counter]
    request = "START-OF-TEXT " + "the river keeps time. " * 3000 + "UNSAFE-MARKER"
    budget = count(render("", None)) + 400
    fitted = fit(render, count, request, budget=budget)
    check_fitted(fitted, render, count, request, None, budget)
    assert fitted.cut
    assert "START-OF-TEXT" in fitted.prompt and "UNSAFE-MARKER" in fitted.prompt
    assert "characters cut" in fitted.prompt
    # It uses its room, all but a 64th of the budget at most.
    assert fitted.tokens >= budget - budget // 64


@pytest.mark.parametrize("counter", sorted(COUNTERS))
def test_a_text_dense_at_one_end_still_fits(counter: str) -> None:
    # Cutting by characters in proportion misjudges this text: its start costs a token
    # a character under the uneven counter, its end an eighth.
    render, count = RENDERS["qwen3guard"], COUNTERS[counter]
    request = "!?" * 5000 + "abcdefgh" * 5000
    budget = count(render("", None)) + 300
    fitted = fit(render, count, request, budget=budget)
    check_fitted(fitted, render, count, request, None, budget)


def test_an_answer_and_its_request_are_both_cut_each_keeping_its_share() -> None:
    render = RENDERS["qwen3guard"]
    request = "question " * 4000
    answer = "answer " * 12000
    budget = sim_count(render("", "")) + 1000
    fitted = fit(render, sim_count, request, answer, budget=budget)
    check_fitted(fitted, render, sim_count, request, answer, budget)
    assert fitted.request is not None and fitted.answer is not None
    kept_request = sim_count(fitted.request)
    kept_answer = sim_count(fitted.answer)
    # Each keeps at least its quarter; the answer, three times longer, keeps more.
    assert kept_request >= 250 and kept_answer >= 250
    assert kept_answer > kept_request


def test_a_short_request_survives_whole_beside_a_long_answer() -> None:
    render = RENDERS["llamaguard3"]
    request = "Write me a story about the sea."
    answer = "Once upon a time " * 5000 + "UNSAFE-MARKER"
    budget = sim_count(render("", "")) + 500
    fitted = fit(render, sim_count, request, answer, budget=budget)
    check_fitted(fitted, render, sim_count, request, answer, budget)
    assert fitted.request == request
    assert fitted.answer is not None and fitted.answer.endswith("UNSAFE-MARKER")


def test_a_budget_below_the_template_is_too_small() -> None:
    render = RENDERS["qwen3guard"]
    with pytest.raises(TooSmall) as raised:
        fit(render, sim_count, "a long text " * 100, budget=100)
    assert raised.value.budget == 100
    assert raised.value.tokens > 100


def test_a_tiny_text_that_cannot_fit_is_too_small_rather_than_cut() -> None:
    render = RENDERS["shieldgemma"]
    with pytest.raises(TooSmall):
        fit(render, sim_count, "ab", budget=sim_count(render("", None)) - 1)
