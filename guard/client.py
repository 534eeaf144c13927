"""Ask a judge model about a request or an answer, and read its verdict.

One judgement is one raw completion to a ready replica of the judge model (ShieldGemma:
one per policy; the json format, which has no template of its own, goes to the chat
endpoint): the prompt written by ``guard.formats``, ``temperature`` 0, the format's
small ``max_tokens`` and ``logprobs``. The answer is the verdict, the categories, the
refusal (Qwen3Guard judging an answer), the probability of unsafe read from the verdict
token's logprobs where the engine gives them, and the latency.

Long texts are cut to fit (``guard.longtext``): the rendered prompt is counted by the
engine's own tokenizer (llama-server's ``/tokenize`` body ``{"content", "add_special",
"parse_special"}``, else vLLM's ``{"prompt"}``, else llama-cpp-python's
``/extras/tokenize``; for the chat endpoint, llama-server's ``/apply-template`` or vLLM's
``{"messages"}`` body), or by the safe ``estimate_tokens`` when the engine has none. A prompt the estimate already fits is sent without asking. The prompt and the
answer's budget never overflow the context, and a long text is judged, never refused.

Failures raise ``JudgeFailure`` with a ``kind``: ``timeout`` (no answer in time, the
connection refused or dropped), ``http_error`` (an error status: ``status`` and an
excerpt of the body), ``unreadable`` (an answer outside the format's grammar, or not an
OpenAI-style body) and ``context`` (the judge's context cannot hold its template and its
answer: a configuration error, whatever the text). Section numbers (§) refer to
/work/shared/spec/guard-formats.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from guard import formats
from guard.formats import SAFE, Format, UnreadableAnswer, Verdict, merge
from guard.longtext import Fitted, TooSmall, estimate_tokens, fit

TIMEOUT = "timeout"
HTTP_ERROR = "http_error"
UNREADABLE = "unreadable"
CONTEXT = "context"
KINDS = (TIMEOUT, HTTP_ERROR, UNREADABLE, CONTEXT)

# Room for each format's whole answer (§1.8: three short lines, 32-64; §2.6: "unsafe"
# and a codes line; §3.4: only the first word is read, a few tokens allow for a leading
# space or newline; §4: one small JSON object naming a few categories).
MAX_TOKENS = {"qwen3guard": 64, "llamaguard3": 32, "shieldgemma": 4, "json": 128}
# Alternatives per generated token: enough for every verdict's spelling (Qwen3Guard has
# three), well under vLLM's default --max-logprobs of 20 (§5.2).
TOP_LOGPROBS = 5
# A BOS token llama-server adds to a string prompt (§5.1), which /tokenize with
# add_special false does not count.
BOS_RESERVE = 1
# What an unknown chat template may wrap around the json format's message when the
# engine can neither apply it nor count it: a generous allowance, not a proof (ChatML
# adds about 10 tokens, Llama 3 with its default system turn about 30).
CHAT_RESERVE = 256
# How much of an error body a failure quotes.
EXCERPT = 500


class JudgeFailure(Exception):
    """A judge that gave no verdict: ``kind`` says why (one of ``KINDS``)."""

    def __init__(
        self, kind: str, message: str, *, status: int | None = None, body: str = "", text: str = ""
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.body = body
        self.text = text


@dataclass(frozen=True)
class JudgeAnswer:
    """A judge's verdict on one text.

    ``score`` is P(unsafe) from the verdict token's logprobs, None when the engine gave
    none. ``latency_ms`` is the whole ask, counting and cutting included.
    ``prompt_tokens`` is what the engine reports it read, else the count the prompt
    was fitted by (ShieldGemma: over all its prompts). ``cut`` says a text's middle was left out to fit.
    """

    verdict: str
    categories: tuple[str, ...]
    refusal: bool | None
    score: float | None
    latency_ms: float
    prompt_tokens: int
    cut: bool
    raw: str = ""


def ask_judge(
    endpoint: str,
    fmt: Format | str,
    request: str,
    answer: str | None = None,
    *,
    context_length: int,
    categories: Sequence[str] | None = None,
    variant: str | None = None,
    max_tokens: int | None = None,
    timeout: float = 10.0,
    model: str | None = None,
    controversial: str = SAFE,
    client: httpx.Client | None = None,
) -> JudgeAnswer:
    """Return a judge's verdict on a request, or on an answer to it.

    ``endpoint`` is the replica's base URL (with or without ``/v1``); ``fmt`` a
    ``guard.formats`` format or its name; ``context_length`` the judge's context in
    tokens (lowered to what the engine reports, if less); ``max_tokens`` the answer's
    budget (``MAX_TOKENS`` by default); ``timeout`` the seconds the whole ask may take;
    ``model`` the name sent in the body (vLLM checks it; llama-server ignores it);
    ``controversial`` how Qwen3Guard's Controversial counts in the score; ``client`` an
    ``httpx.Client`` to reuse (one is made and closed otherwise).

    Raises:
        JudgeFailure: no verdict (see the module's docstring for the kinds).
        ValueError: a bad argument (an unknown format, variant or category list).
        TypeError: a judged text that is not a string.
    """
    started = time.perf_counter()
    judge = formats.get(fmt) if isinstance(fmt, str) else fmt
    budget = MAX_TOKENS.get(judge.name, 64) if max_tokens is None else max_tokens
    if isinstance(context_length, bool) or not isinstance(context_length, int):
        raise ValueError("context_length must be an integer")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError("max_tokens must be a positive integer")
    if not timeout > 0:
        raise ValueError("timeout must be positive")
    request = _clean(request)
    answer = None if answer is None else _clean(answer)
    prompts = judge.prompts(
        request,
        answer,
        categories=categories,
        variant=variant,
        for_raw_completion=judge.raw_completion,
    )
    http = client if client is not None else httpx.Client()
    try:
        engine = _Engine(http, endpoint, started + timeout, model)
        asked = [
            _ask(engine, judge, request, answer, p.categories, variant, context_length, budget)
            for p in prompts
        ]
    finally:
        if client is None:
            http.close()
    verdict = asked[0].verdict if len(asked) == 1 else merge([a.verdict for a in asked])
    scores = [_score(judge, a.logprobs, controversial) for a in asked]
    return JudgeAnswer(
        verdict=verdict.verdict,
        categories=verdict.categories,
        refusal=verdict.refusal,
        score=None if None in scores else max(s for s in scores if s is not None),
        latency_ms=(time.perf_counter() - started) * 1000.0,
        prompt_tokens=sum(a.prompt_tokens for a in asked),
        cut=any(a.cut for a in asked),
        raw=verdict.raw,
    )


@dataclass(frozen=True)
class _Asked:
    """One prompt's answer: the verdict, its logprobs as the engine gave them, the cost."""

    verdict: Verdict
    logprobs: Any
    prompt_tokens: int
    cut: bool


def _ask(
    engine: _Engine,
    judge: Format,
    request: str,
    answer: str | None,
    categories: tuple[str, ...] | None,
    variant: str | None,
    context_length: int,
    max_tokens: int,
) -> _Asked:
    """Return the answer to one prompt, cut to fit, asked once more if the engine's context is less."""
    chat = not judge.raw_completion

    def render(req: str, ans: str | None) -> str:
        return judge.render(
            req, ans, categories=categories, variant=variant, for_raw_completion=not chat
        )

    context = context_length
    for retry in (False, True):
        fitted = _fit(engine, render, chat, request, answer, context, max_tokens)
        body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
        if engine.model is not None:
            body["model"] = engine.model
        if chat:
            path = "/v1/chat/completions"
            body["messages"] = [{"role": "user", "content": fitted.prompt}]
            body["logprobs"] = True
            body["top_logprobs"] = TOP_LOGPROBS
            # The answer is then readable by construction, "safe" first (§4).
            schema = formats.json_schema(categories)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema},
            }
        else:
            path = "/v1/completions"
            body["prompt"] = fitted.prompt
            body["logprobs"] = TOP_LOGPROBS
        response = engine.post(path, body)
        smaller = _engine_context(response) if response.status_code == 400 else None
        # The engine's context is less than the judge's record says (a llama-server
        # slot's share, or a stale catalog): fit again to what it says, once.
        if not retry and smaller is not None and smaller < context:
            context = smaller
            continue
        break
    if response.status_code != 200:
        excerpt = response.text[:EXCERPT]
        raise JudgeFailure(
            HTTP_ERROR,
            f"the judge at {engine.base} answered HTTP {response.status_code}: {excerpt}",
            status=response.status_code,
            body=excerpt,
        )
    data = _json(response)  # parsed once: a body with logprobs is the largest thing read
    choice = _choice(data, response, chat)
    text = choice.get("text") if not chat else (choice.get("message") or {}).get("content")
    if not isinstance(text, str):
        raise JudgeFailure(
            UNREADABLE, "the judge's answer holds no text", body=response.text[:EXCERPT]
        )
    try:
        verdict = judge.parse(
            text, categories=categories, answer=answer is not None, variant=variant
        )
    except UnreadableAnswer as error:
        ended = " (it ran out of max_tokens)" if choice.get("finish_reason") == "length" else ""
        raise JudgeFailure(
            UNREADABLE, f"the judge's answer is unreadable{ended}: {error.reason}", text=text
        ) from None
    usage = data.get("usage")
    reported = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    tokens = reported if isinstance(reported, int) and not isinstance(reported, bool) else None
    return _Asked(
        verdict, choice.get("logprobs"), fitted.tokens if tokens is None else tokens, fitted.cut
    )


def _fit(
    engine: _Engine,
    render: Callable[[str, str | None], str],
    chat: bool,
    request: str,
    answer: str | None,
    context: int,
    max_tokens: int,
) -> Fitted:
    """Return the prompt cut to fit the context less the answer's budget and a BOS token."""

    def budget() -> int:
        limit = context if engine.context is None else min(context, engine.context)
        return limit - max_tokens - BOS_RESERVE

    def estimate(text: str) -> int:
        return estimate_tokens(text) + (CHAT_RESERVE if chat else 0)

    whole = render(request, answer)
    guess = estimate(whole)
    if guess <= budget():
        # An upper bound fits: no need to ask the engine.
        return Fitted(whole, guess, request, answer, False)
    exact = engine.count_chat if chat else engine.count
    # The first count also learns the engine's /tokenize form and context.
    known = exact(whole) is not None

    def count(text: str) -> int:
        found = exact(text) if known else None
        return estimate(text) if found is None else found

    def count_text(text: str) -> int:
        found = engine.count(text) if known else None
        return estimate_tokens(text) if found is None else found

    try:
        return fit(render, count, request, answer, budget=budget(), count_text=count_text)
    except TooSmall as error:
        raise JudgeFailure(
            CONTEXT, f"the judge's context ({context} tokens) cannot hold its prompt: {error}"
        ) from None


class _Engine:
    """One replica as one ask sees it: its URL, the time left, what it tokenizes with."""

    def __init__(
        self, client: httpx.Client, endpoint: str, deadline: float, model: str | None
    ) -> None:
        self.client = client
        self.base = _base(endpoint)
        self.deadline = deadline
        self.model = model
        # The tokenize body the engine reads ("llama", "vllm", "extras"), "none", or None:
        # not tried yet.
        self.form: str | None = None
        # How the json format's chat prompt is counted ("apply", "vllm", "none", None).
        self.chat_form: str | None = None
        # The context the engine reports (vLLM's /tokenize max_model_len), if it does.
        self.context: int | None = None
        self.counts: dict[str, int | None] = {}
        self.chat_counts: dict[str, int | None] = {}

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        """POST a JSON body within the time left.

        Raises:
            JudgeFailure: timeout, the time is up or the engine cannot be reached.
        """
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise JudgeFailure(TIMEOUT, f"the judge at {self.base} did not answer in time")
        try:
            return self.client.post(self.base + path, json=body, timeout=left)
        except httpx.TimeoutException:
            raise JudgeFailure(
                TIMEOUT, f"the judge at {self.base} did not answer in time ({path})"
            ) from None
        except httpx.TransportError as error:
            raise JudgeFailure(
                TIMEOUT, f"the judge at {self.base} cannot be reached ({path}): {error!r}"
            ) from None

    def count(self, text: str) -> int | None:
        """Return the engine's count of a raw prompt's tokens, None when it cannot tell."""
        if text not in self.counts:
            self.counts[text] = self._tokenize(text)
        return self.counts[text]

    def _tokenize(self, text: str) -> int | None:
        model = {"model": self.model} if self.model else {}
        forms = (
            ("llama", "/tokenize", {"content": text, "add_special": False, "parse_special": True}),
            ("vllm", "/tokenize", {"prompt": text, **model}),
            # llama-cpp-python's server (facts.md); it counts the BOS token too.
            ("extras", "/extras/tokenize", {"input": text, **model}),
        )
        missing: set[str] = set()
        for name, path, body in forms:
            if self.form not in (None, name) or path in missing:
                continue
            response = self.post(path, body)
            found = self._read_count(response, text, needs_count=False)
            if found is not None:
                self.form = name
                return found
            if self.form == name:
                return None  # the form that worked before failed now: estimate this one
            if response.status_code in (404, 405):
                missing.add(path)
        self.form = "none"
        return None

    def count_chat(self, content: str) -> int | None:
        """Return the engine's count of a chat prompt holding one user message, or None."""
        if content not in self.chat_counts:
            self.chat_counts[content] = self._tokenize_chat(content)
        return self.chat_counts[content]

    def _tokenize_chat(self, content: str) -> int | None:
        messages = [{"role": "user", "content": content}]
        if self.chat_form in (None, "apply"):
            # llama-server renders the model's template, then its text is counted.
            response = self.post("/apply-template", {"messages": messages})
            prompt = _json(response).get("prompt") if response.status_code == 200 else None
            if isinstance(prompt, str):
                self.chat_form = "apply"
                return self.count(prompt)
        if self.chat_form in (None, "vllm"):
            body: dict[str, Any] = {"messages": messages, "add_generation_prompt": True}
            if self.model:
                body["model"] = self.model
            # Only vLLM's answer carries "count": llama-server answers this form with no
            # tokens at all, which must not read as zero.
            found = self._read_count(self.post("/tokenize", body), content, needs_count=True)
            if found is not None:
                self.chat_form = "vllm"
                return found
        self.chat_form = "none"
        return None

    def _read_count(self, response: httpx.Response, text: str, *, needs_count: bool) -> int | None:
        """Return the count in a /tokenize answer, None if it holds none that can be true."""
        if response.status_code != 200:
            return None
        data = _json(response)
        tokens = data.get("tokens")
        count = data.get("count")
        if not isinstance(count, int) or isinstance(count, bool):
            if needs_count or not isinstance(tokens, list):
                return None
            count = len(tokens)
        # llama-server answers a body without "content" with no tokens: not a count.
        if count <= 0 and text:
            return None
        limit = data.get("max_model_len")
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            self.context = limit if self.context is None else min(self.context, limit)
        return count


_CONTEXT_RE = re.compile(r"maximum context length is (\d+)")


def _engine_context(response: httpx.Response) -> int | None:
    """Return the context an overflow error names: llama-server's n_ctx, vLLM's message."""
    error = _json(response).get("error")
    if isinstance(error, dict):
        n_ctx = error.get("n_ctx")
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
            return n_ctx
    found = _CONTEXT_RE.search(response.text)
    return int(found.group(1)) if found else None


def _json(response: httpx.Response) -> dict[str, Any]:
    """Return a response's JSON object, or an empty one when it is not one."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _choice(data: dict[str, Any], response: httpx.Response, chat: bool) -> dict[str, Any]:
    """Return the first choice of a completion body (``data``, the response's JSON).

    Raises:
        JudgeFailure: unreadable, the body is not an OpenAI-style completion.
    """
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        kind = "chat completion" if chat else "completion"
        raise JudgeFailure(
            UNREADABLE, f"the judge's answer is not a {kind}", body=response.text[:EXCERPT]
        )
    return choices[0]


def _score(judge: Format, logprobs: Any, controversial: str) -> float | None:
    """Return P(unsafe) from an answer's logprobs, None when they are missing or malformed."""
    try:
        return judge.unsafe_score(logprobs, controversial=controversial)
    except ValueError:
        # Odd logprobs cost the score, not the verdict the text gave.
        return None


def _base(endpoint: str) -> str:
    """Return the replica's base URL: no trailing slash, no /v1."""
    base = endpoint.rstrip("/")
    return base.removesuffix("/v1")


def _clean(text: str) -> str:
    """Return text that encodes as UTF-8: lone surrogates (JSON's "\\ud800") become U+FFFD."""
    if not isinstance(text, str):
        raise TypeError("the judged texts must be strings")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Through UTF-16, a split pair joins again and a lone half is replaced.
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
