"""Context length at the door: the bytes settle it when they can."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.path.sizing import ASK, EXCEEDS, FITS, MAX_TOKEN_BYTES, effective_context, judge


@given(
    prompt=st.integers(0, 10**6),
    messages=st.integers(1, 50),
    max_tokens=st.integers(1, 10**5),
    context=st.integers(1, 10**6),
    true_tokens_per_byte=st.floats(1 / MAX_TOKEN_BYTES, 1.0),
)
def test_the_bounds_are_never_wrong(
    prompt: int, messages: int, max_tokens: int, context: int, true_tokens_per_byte: float
) -> None:
    """Whatever the true count (between the bounds), FITS and EXCEEDS are never wrong."""
    true_tokens = int(prompt * true_tokens_per_byte)
    verdict = judge(prompt, messages, max_tokens, context)
    if verdict == FITS:
        assert true_tokens + max_tokens <= context
    elif verdict == EXCEEDS:
        assert -(-prompt // MAX_TOKEN_BYTES) + max_tokens > context


def test_small_fits_huge_exceeds_the_middle_asks() -> None:
    assert judge(100, 1, 100, 4096) == FITS
    assert judge(10_000_000, 1, 100, 4096) == EXCEEDS
    assert judge(5000, 1, 100, 4096) == ASK
    assert judge(5000, 1, 100, 0) == FITS  # no context length known


def test_llama_server_slots_divide_the_context() -> None:
    assert effective_context(8192, ["--ctx-size", "8192", "--parallel", "4"]) == (
        2048,
        "llama-server's --ctx-size 8192 is shared by 4 slot(s): 2048 each",
    )
    assert effective_context(2048, ["-c", "8192", "-np", "4"])[0] == 2048
    assert effective_context(4096, ["--threads", "2"]) == (4096, "")
    assert effective_context(0, ["--ctx-size=1024"])[0] == 1024
    # Every spelling llama-server takes (its table): --a_b is --a-b.
    assert effective_context(0, ["--ctx_size", "4096", "--parallel", "2"])[0] == 2048
