"""Fit judged text into a judge's context: keep its start and its end, and mark the cut.

A judge reads the request and, when it judges an answer, the answer too. When the prompt
those make is longer than the judge's room (its context length less the answer's
budget), the middle of the long text is cut out and replaced by a marker naming how much
is gone. The start (instructions, a jailbreak's set-up) and the end (the last turn, the
conclusion) are what a judge most needs, and an unsafe ending is never cut away.

Everything here is pure: the caller passes ``render`` (the judged texts to the prompt
text) and ``count`` (a prompt to its tokens: the engine's /tokenize, or
``estimate_tokens``). Texts are cut before rendering and the whole rendered prompt is
counted after, so the template, the neutralising and the markers are all counted
exactly, by the judge's own tokenizer when there is one.

The room is shared between the texts (``share``): each keeps up to a quarter of the room
(``MIN_SHARE``) whatever the other's length, and the rest goes to each in proportion to
what it still lacks. A short request next to a long answer is kept whole; two long ones
are cut by the same fraction beyond their quarter. Within a text, the start and the end
get half each.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Counter = Callable[[str], int]
Render = Callable[[str, str | None], str]

# The share of the room each judged text keeps when it needs it, whatever the other's
# length: at most 1/2, as there are at most two texts.
MIN_SHARE = 0.25
# Written where a text's middle was cut; it holds no "<" and no turn label, so the
# formats' neutralising leaves it as written and the judge reads it.
MARKER = "\n[… {cut} characters cut …]\n"

# How many rooms are tried at most; most prompts fit at the first or second.
_STEPS = 12


class TooSmall(ValueError):
    """The judge's room cannot hold its template, even with the texts cut to a character."""

    def __init__(self, tokens: int, budget: int) -> None:
        super().__init__(
            f"the judge's prompt takes {tokens} tokens with its texts cut to the bone, "
            f"more than the {budget} it has room for"
        )
        self.tokens = tokens
        self.budget = budget


@dataclass(frozen=True)
class Fitted:
    """A prompt that fits: its text, its token count and the texts it was made of."""

    prompt: str
    tokens: int
    request: str
    answer: str | None
    cut: bool
    # The request's, the answer's middle was left out: what the judge read of it was
    # its start and end only.
    request_cut: bool = False
    answer_cut: bool = False


def estimate_tokens(text: str) -> int:
    """Return an upper bound of the tokens a judge's tokenizer makes of text: its UTF-8 bytes.

    Why it is safe: byte-level BPE tokenizers (GPT-2 style: SmolLM2, Llama 3, Qwen)
    cover at least one byte of the text with every token, and SentencePiece ones
    (Gemma) fall back to one token per byte for what their vocabulary lacks, so no
    tokenizer makes more tokens than the text has bytes, plus one for a SentencePiece
    space prefix. The bytes counted are those of the text after the Unicode
    normalisation a tokenizer may apply first (Qwen's NFC; NFKC, which turns U+FDFA into
    18 characters), whichever is longest. The sim's tokens are at least one character
    each. Special tokens only lower the count. A BOS token the server adds is not text:
    the caller reserves it.

    Half the bytes, the usual rule of thumb, is not safe: punctuation, digits and
    characters outside a vocabulary take a token per byte (or per character).
    """
    size = _utf8_size(text)
    if not text.isascii():
        for form in ("NFC", "NFKC"):
            size = max(size, _utf8_size(unicodedata.normalize(form, text)))
    return size + 1


def _utf8_size(text: str) -> int:
    # A lone surrogate (from JSON's "\ud800") counts as the three bytes it is encoded as.
    return len(text.encode("utf-8", "surrogatepass"))


def marker(cut: int) -> str:
    """Return the marker written where ``cut`` characters of a text were taken out."""
    return MARKER.format(cut=cut)


def share(sizes: Sequence[int], room: int, min_share: float = MIN_SHARE) -> list[int]:
    """Return how many of each text's tokens to keep so that they add up to at most ``room``.

    Texts that fit together are kept whole. Otherwise each first gets up to
    ``min_share`` of the room (all of itself if shorter), and what room is left goes to
    each in proportion to the part of it still missing, never more than that part.
    """
    if any(size < 0 for size in sizes):
        raise ValueError("sizes must not be negative")
    if not 0 <= min_share * len(sizes) <= 1:
        raise ValueError("the minimum shares must add up to no more than the room")
    room = max(0, room)
    if sum(sizes) <= room:
        return list(sizes)
    floor = int(room * min_share)
    first = [min(size, floor) for size in sizes]
    left = room - sum(first)
    missing = [size - kept for size, kept in zip(sizes, first, strict=True)]
    # sum(missing) > left, since the sizes add up to more than the room: each share of
    # ``left`` is below what its text misses.
    total = sum(missing)
    return [kept + left * miss // total for kept, miss in zip(first, missing, strict=True)]


def shorten(text: str, keep: int, size: int) -> str:
    """Return text cut to about ``keep`` of its ``size`` tokens: its start, the marker, its end.

    Characters are kept in proportion to the tokens kept, half at each end, and at least
    one at each end; a text already that short is returned as it is.
    """
    if keep >= size or len(text) <= 2:
        return text
    chars = len(text) * max(0, keep) // size
    head = max(1, (chars + 1) // 2)
    tail = max(1, chars // 2)
    if head + tail >= len(text):
        return text
    return text[:head] + marker(len(text) - head - tail) + text[len(text) - tail :]


def fit(
    render: Render,
    count: Counter,
    request: str,
    answer: str | None = None,
    *,
    budget: int,
    min_share: float = MIN_SHARE,
    count_text: Counter | None = None,
) -> Fitted:
    """Return the prompt about request (and answer), its texts cut until it takes ≤ ``budget`` tokens.

    A prompt that fits is returned as rendered. Otherwise the room left for the texts
    (the budget less the template and the markers) is shared between them (``share``),
    each is cut to its share (``shorten``), and the cut prompt is counted again. When it
    does not fit, or leaves more than a 64th of the budget unused, the room is searched
    (at most ``_STEPS`` tries), down to the texts cut to one character at each end. The
    returned prompt's count is ``count``'s own, so the result fits by ``count``'s
    measure whatever the texts hold.

    ``count_text`` counts a text alone, for sharing the room (``count`` by default; a
    chat prompt's counter would add the chat template to each text).

    Raises:
        TooSmall: even the texts cut to a character at each end do not fit: the budget
            cannot hold the template itself, whatever the texts.
    """
    prompt = render(request, answer)
    tokens = count(prompt)
    if tokens <= budget:
        return Fitted(prompt, tokens, request, answer, False)

    texts = [request] if answer is None else [request, answer]
    # A text of one or two characters cannot lose its middle: it counts as template.
    measure = count if count_text is None else count_text
    sizes = [measure(text) if len(text) > 2 else 0 for text in texts]
    overhead = max(0, tokens - sum(sizes))
    markers = sum(measure(marker(len(t))) for t, s in zip(texts, sizes, strict=True) if s)

    def attempt(room: int) -> Fitted:
        kept = share(sizes, room, min_share)
        cut = [
            shorten(text, keep, size) if size else text
            for text, keep, size in zip(texts, kept, sizes, strict=True)
        ]
        new_request, new_answer = cut[0], (cut[1] if answer is not None else None)
        text = render(new_request, new_answer)
        return Fitted(text, count(text), new_request, new_answer, cut != texts,
                      new_request != request, answer is not None and new_answer != answer)  # fmt: skip

    best, fail_room, fail_tokens = _search(
        attempt, budget, budget - overhead - markers, sum(sizes), tokens
    )
    if best is not None:
        return best
    if fail_room > 0:
        best = attempt(0)
        if best.tokens <= budget:
            return best
        fail_tokens = best.tokens
    raise TooSmall(fail_tokens, budget)


def _search(
    attempt: Callable[[int], Fitted], budget: int, room: int, fail_room: int, fail_tokens: int
) -> tuple[Fitted | None, int, int]:
    """Search the room for the texts, starting at ``room``; return the best prompt found
    that fits (None when none did) and the smallest room known not to, with its tokens.

    The room is searched between the largest known to fit and the smallest known not to
    (all of the texts, ``fail_room``, to begin with), each guess read off the line
    through the two (or, before anything fits, the last two tried): a text's tokens need
    not be spread evenly over its characters, so the first guess, from the counts, may
    miss. A prompt within a 64th of the budget ends the search.
    """
    fit_room, fit_tokens, best = -1, 0, None
    last_room, last_tokens = fail_room, fail_tokens
    slack = max(1, budget // 64)
    for _ in range(_STEPS):
        room = max(fit_room + 1, min(room, fail_room - 1))
        if room >= fail_room:
            break  # nothing left between them
        tried = attempt(room)
        if tried.tokens <= budget:
            fit_room, fit_tokens, best = room, tried.tokens, tried
            if budget - tried.tokens <= slack:
                return tried, fail_room, fail_tokens
        else:
            fail_room, fail_tokens = room, tried.tokens
        if best is not None:
            x0, y0, x1, y1 = fit_room, fit_tokens, fail_room, fail_tokens
        else:
            x0, y0, x1, y1 = room, tried.tokens, last_room, last_tokens
        last_room, last_tokens = room, tried.tokens
        if x1 != x0 and (y1 - y0) * (x1 - x0) > 0:
            # Aim half the slack under the budget, inside the window that is accepted.
            room = x0 + (budget - slack // 2 - y0) * (x1 - x0) // (y1 - y0)
        else:
            room = (fit_room + fail_room) // 2
    return best, fail_room, fail_tokens
