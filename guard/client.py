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

Failures raise ``JudgeFailure`` with a ``kind``: ``timeout`` (no whole answer in time),
``refused`` (the connection refused, reset or dropped, or not HTTP), ``http_error`` (an
error status: ``status`` and an excerpt of the body), ``unreadable`` (an answer outside
the format's grammar, or not an OpenAI-style body) and ``context`` (the judge's context cannot hold its template and its
answer: a configuration error, whatever the text). Section numbers (§) refer to
/work/shared/spec/guard-formats.md.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from guard import formats, pool
from guard.formats import SAFE, Format, UnreadableAnswer, Verdict, merge
from guard.longtext import Fitted, TooSmall, estimate_tokens, fit

TIMEOUT = "timeout"
REFUSED = "refused"
HTTP_ERROR = "http_error"
UNREADABLE = "unreadable"
CONTEXT = "context"
KINDS = (TIMEOUT, REFUSED, HTTP_ERROR, UNREADABLE, CONTEXT)

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


class Answer(Protocol):
    """An engine's HTTP answer as read here (``httpx.Response``, ``guard.pool.Reply``)."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    def json(self) -> Any: ...


class Client(Protocol):
    """What asks an engine: ``guard.pool.Pool`` on the check's path, or an ``httpx.Client``."""

    def post(self, url: str, *, json: Any, timeout: float, headers: Any = None) -> Answer: ...


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
    # The request's, the answer's middle was left out (guard.longtext).
    request_cut: bool = False
    answer_cut: bool = False


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
    client: Client | None = None,
    key: str = "",
) -> JudgeAnswer:
    """Return a judge's verdict on a request, or on an answer to it.

    ``endpoint`` is the replica's base URL (with or without ``/v1``); ``fmt`` a
    ``guard.formats`` format or its name; ``context_length`` the judge's context in
    tokens (lowered to what the engine reports, if less); ``max_tokens`` the answer's
    budget (``MAX_TOKENS`` by default); ``timeout`` the seconds the whole ask may take;
    ``model`` the name sent in the body (vLLM checks it; llama-server ignores it);
    ``controversial`` how Qwen3Guard's Controversial counts in the score; ``client`` a
    ``guard.pool.Pool`` or an ``httpx.Client`` to reuse (a pool is made and closed
    otherwise); ``key`` the judge replica's engine key (``cluster.enginekeys``), sent as
    ``Authorization: Bearer`` on every call to it.

    Raises:
        JudgeFailure: no verdict (see the module's docstring for the kinds).
        ValueError: a bad argument (an unknown format, variant or category list).
        TypeError: a judged text that is not a string.
    """
    started = time.perf_counter()
    judge, budget, request, answer, prompts = _setup(
        fmt, request, answer, context_length, max_tokens, timeout, categories, variant
    )
    http = client if client is not None else pool.Pool()
    try:
        engine = _Engine(http, endpoint, started + timeout, model, key)
        asked = [
            _ask(engine, judge, request, answer, p.categories, variant, context_length, budget)
            for p in prompts
        ]
    finally:
        if client is None:
            http.close()
    return _judged(judge, asked, controversial, started)


async def ask_judge_on_loop(
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
    conns: pool.AsyncPool,
    key: str = "",
) -> JudgeAnswer | None:
    """``ask_judge`` on the event loop, for a prompt that fits by the safe estimate.

    The same prompt, body, answer and failures as ``ask_judge``, through ``conns``
    (``guard.pool.AsyncPool``) without leaving the loop. None when ``ask_judge`` is
    needed: a prompt that only the engine's own tokenizer can fit (its counting calls
    are blocking ones), or an engine whose context turned out smaller than the judge's
    record (``ask_judge`` fits again and asks once more).

    Raises:
        JudgeFailure, ValueError, TypeError: as ``ask_judge``.
    """
    started = time.perf_counter()
    judge, budget, request, answer, prompts = _setup(
        fmt, request, answer, context_length, max_tokens, timeout, categories, variant
    )
    base = _base(endpoint)
    chat = not judge.raw_completion
    asked = []
    for p in prompts:
        render = _renderer(judge, p.categories, variant, chat)
        fitted = _fits_by_estimate(render, chat, request, answer, context_length, budget)
        if fitted is None:
            return None
        path, body = _body(model, chat, fitted.prompt, budget, p.categories)
        left = started + timeout - time.perf_counter()
        if left <= 0:
            raise _timed_out(base)
        try:
            response = await conns.post(base + path, json=body, timeout=left, headers=_auth(key))
        except pool.Timeout:
            raise _timed_out(base, path) from None
        except pool.Unreachable as error:
            raise _unreachable(base, path, error) from None
        if response.status_code == 400:
            smaller = _engine_context(response)
            if smaller is not None and smaller < context_length:
                return None
        asked.append(_read(response, base, judge, chat, p.categories, answer, variant, fitted))
    return _judged(judge, asked, controversial, started)


def _setup(
    fmt: Format | str,
    request: str,
    answer: str | None,
    context_length: int,
    max_tokens: int | None,
    timeout: float,
    categories: Sequence[str] | None,
    variant: str | None,
) -> tuple[Format, int, str, str | None, Any]:
    """Check an ask's arguments; return the format, the answer's budget, the texts
    cleaned and the prompts to send (one, or ShieldGemma's one per policy)."""
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
    return judge, budget, request, answer, prompts


def _judged(judge: Format, asked: list[_Asked], controversial: str, started: float) -> JudgeAnswer:
    """Return the answers to an ask's prompts as one verdict, scored."""
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
        request_cut=any(a.request_cut for a in asked),
        answer_cut=any(a.answer_cut for a in asked),
    )


@dataclass(frozen=True)
class _Asked:
    """One prompt's answer: the verdict, its logprobs as the engine gave them, the cost."""

    verdict: Verdict
    logprobs: Any
    prompt_tokens: int
    cut: bool
    request_cut: bool = False
    answer_cut: bool = False


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
    render = _renderer(judge, categories, variant, chat)
    context = context_length
    for retry in (False, True):
        fitted = _fit(engine, render, chat, request, answer, context, max_tokens)
        path, body = _body(engine.model, chat, fitted.prompt, max_tokens, categories)
        response = engine.post(path, body)
        smaller = _engine_context(response) if response.status_code == 400 else None
        # The engine's context is less than the judge's record says (a llama-server
        # slot's share, or a stale catalog): fit again to what it says, once.
        if not retry and smaller is not None and smaller < context:
            context = smaller
            continue
        break
    return _read(response, engine.base, judge, chat, categories, answer, variant, fitted)


def _renderer(
    judge: Format, categories: tuple[str, ...] | None, variant: str | None, chat: bool
) -> Callable[[str, str | None], str]:
    """Return the function writing one prompt for a request (and an answer)."""

    def render(req: str, ans: str | None) -> str:
        return judge.render(
            req, ans, categories=categories, variant=variant, for_raw_completion=not chat
        )

    return render


def _body(
    model: str | None,
    chat: bool,
    prompt: str,
    max_tokens: int,
    categories: tuple[str, ...] | None,
) -> tuple[str, dict[str, Any]]:
    """Return the path and the JSON body that ask an engine about one prompt."""
    body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0}
    if model is not None:
        body["model"] = model
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
        body["logprobs"] = True
        body["top_logprobs"] = TOP_LOGPROBS
        # The answer is then readable by construction, "safe" first (§4).
        schema = formats.json_schema(categories)
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "verdict", "schema": schema},
        }
        return "/v1/chat/completions", body
    body["prompt"] = prompt
    body["logprobs"] = TOP_LOGPROBS
    return "/v1/completions", body


def _read(
    response: Answer,
    base: str,
    judge: Format,
    chat: bool,
    categories: tuple[str, ...] | None,
    answer: str | None,
    variant: str | None,
    fitted: Fitted,
) -> _Asked:
    """Return an engine's answer to one prompt as a verdict with its logprobs.

    Raises:
        JudgeFailure: an error status, or an answer that is not the format's.
    """
    if response.status_code != 200:
        excerpt = response.text[:EXCERPT]
        raise JudgeFailure(
            HTTP_ERROR,
            f"the judge at {base} answered HTTP {response.status_code}: {excerpt}",
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
        verdict, choice.get("logprobs"), fitted.tokens if tokens is None else tokens, fitted.cut,
        fitted.request_cut, fitted.answer_cut,
    )  # fmt: skip


def _fits_by_estimate(
    render: Callable[[str, str | None], str],
    chat: bool,
    request: str,
    answer: str | None,
    limit: int,
    max_tokens: int,
) -> Fitted | None:
    """Return the whole prompt when the safe estimate already fits it in ``limit`` less
    the answer's budget and a BOS token; None when only counting can tell."""
    whole = render(request, answer)
    guess = estimate_tokens(whole) + (CHAT_RESERVE if chat else 0)
    if guess <= limit - max_tokens - BOS_RESERVE:
        return Fitted(whole, guess, request, answer, False)
    return None


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

    def limit() -> int:
        return context if engine.context is None else min(context, engine.context)

    def budget() -> int:
        return limit() - max_tokens - BOS_RESERVE

    def estimate(text: str) -> int:
        return estimate_tokens(text) + (CHAT_RESERVE if chat else 0)

    # An upper bound that fits needs no asking the engine.
    fitted = _fits_by_estimate(render, chat, request, answer, limit(), max_tokens)
    if fitted is not None:
        return fitted
    whole = render(request, answer)
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
        self, client: Client, endpoint: str, deadline: float, model: str | None, key: str = ""
    ) -> None:
        self.client = client
        self.headers = _auth(key)
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

    def post(self, path: str, body: dict[str, Any]) -> Answer:
        """POST a JSON body within the time left.

        Raises:
            JudgeFailure: timeout, the time is up; refused, the engine cannot be reached.
        """
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise _timed_out(self.base)
        try:
            return self.client.post(self.base + path, json=body, timeout=left, headers=self.headers)
        except (httpx.TimeoutException, pool.Timeout):
            raise _timed_out(self.base, path) from None
        except (httpx.TransportError, pool.Unreachable) as error:
            raise _unreachable(self.base, path, error) from None

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

    def _read_count(self, response: Answer, text: str, *, needs_count: bool) -> int | None:
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


def _timed_out(base: str, path: str | None = None) -> JudgeFailure:
    where = "" if path is None else f" ({path})"
    return JudgeFailure(TIMEOUT, f"the judge at {base} did not answer in time{where}")


def _unreachable(base: str, path: str, error: Exception) -> JudgeFailure:
    return JudgeFailure(REFUSED, f"the judge at {base} cannot be reached ({path}): {error!r}")


_CONTEXT_RE = re.compile(r"maximum context length is (\d+)")


def _engine_context(response: Answer) -> int | None:
    """Return the context an overflow error names: llama-server's n_ctx, vLLM's message."""
    error = _json(response).get("error")
    if isinstance(error, dict):
        n_ctx = error.get("n_ctx")
        if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) and n_ctx > 0:
            return n_ctx
    found = _CONTEXT_RE.search(response.text)
    return int(found.group(1)) if found else None


def _json(response: Answer) -> dict[str, Any]:
    """Return a response's JSON object, or an empty one when it is not one."""
    try:
        data = response.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _choice(data: dict[str, Any], response: Answer, chat: bool) -> dict[str, Any]:
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


def _auth(key: str) -> dict[str, str] | None:
    """Return the headers that carry a judge replica's engine key, or None without one."""
    return {"Authorization": f"Bearer {key}"} if key else None


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


# A judge's timeout from its model's slo (catalog/timeouts.py derives the gateway's waits
# the same way): this many times the time its slo gives a whole verdict (``ttft_p99``,
# and ``tpot_p99`` for each token of the format's answer budget), at least the floor. A
# request waits on its judge, so the factor is small: a judge past three times its p99
# is treated as failing.
JUDGE_FACTOR = 3
JUDGE_FLOOR = 1.0


def judge_timeout(fmt: str | None, ttft_p99_ns: int, tpot_p99_ns: int, default: float) -> float:
    """Return how long one ask of a judge may take in all (seconds).

    ``JUDGE_FACTOR`` × (``slo.ttft_p99`` + the format's ``MAX_TOKENS`` × ``slo.tpot_p99``),
    at least ``JUDGE_FLOOR``, when the judge's model has a ``slo.ttft_p99``; else
    ``default`` (``LLMGW_GUARD_JUDGE_TIMEOUT``).
    """
    if not ttft_p99_ns or ttft_p99_ns <= 0:
        return default
    tokens = MAX_TOKENS.get(fmt or "", 64)
    whole = ttft_p99_ns / 1e9 + tokens * max(0, tpot_p99_ns or 0) / 1e9
    return max(JUDGE_FLOOR, JUDGE_FACTOR * whole)
