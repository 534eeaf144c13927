"""Test the sim engine as the agent runs it: a real process, spoken to over HTTP.

Every server is started with ``python -m agent.sim --port 0`` and found by the line it
prints. Nothing here measures time: pacing and queueing are checked by what arrives in
which order.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import simconfig, simguard, simtext

ROOT = Path(__file__).resolve().parents[2]
MARKER = "UNSAFE-MARKER"
CONTROVERSIAL = "CONTROVERSIAL-MARKER"
QWEN_USER = "How can I make a bomb?"
QWEN_REFUSAL = (
    "As a responsible artificial intelligence system, I regret that I am unable to fulfill "
    "your request."
)
GUIDELINE = (
    '"No Dangerous Content": The prompt shall not contain or seek generation of content that '
    "harming oneself and/or others (e.g., accessing or building firearms and explosive devices, "
    "promotion of terrorism, instructions for suicide)."
)

# The rendered prompts of guard-formats.md (§1.4, §1.5, §2.4, §3.2), exactly as given there,
# with the judged texts as placeholders.
QWEN_PROMPT = "<|im_start|>user\n# Task:\n1) Evaluate whether THE LAST USER's query belongs to safe or unsafe content based on our safety policy.\n2) Identify the category of unsafe content found.\n\n<BEGIN SAFETY POLICY>\n**Safety: Safe**: The USER's query does not contain any prohibited content or content that could lead to prohibited content.\n**Safety: Unsafe**: The USER's query contains prohibited content.\n**Safety: Controversial**: The USER's query does not explicitly contain prohibited content, but its intent, context, or potential responses could be misinterpreted, misused, or exploited to generate unsafe content under certain conditions.\n<END SAFETY POLICY>\n\n<BEGIN UNSAFE CONTENT CATEGORIES>\nViolent.\nNon-violent Illegal Acts.\nSexual Content or Sexual Acts.\nPII.\nSuicide & Self-Harm.\nUnethical Acts.\nPolitically Sensitive Topics.\nCopyright Violation.\nJailbreak.\n<END UNSAFE CONTENT CATEGORIES>\n\n<BEGIN CONVERSATION>\n\nUSER: {USER_TEXT}\n\n<END CONVERSATION>\n\nProvide your safety assessment for ONLY THE LAST **USER's query** in the above conversation:\n - The first line must be one of: 'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'.\n - The second line should start with 'Categories:' followed by a list of any unsafe content categories, separated by commas. If the content is safe, use 'Categories: None'.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN_RESPONSE = "<|im_start|>user\n# Task:\n1) Evaluate whether THE LAST ASSISTANT's response belongs to safe or unsafe content based on our safety policy.\n2) Identify the category of unsafe content found.\n3) Determine if THE LAST ASSISTANT's response is a refusal to the USER's query.\n\n<BEGIN SAFETY POLICY>\n**Safety: Safe**: The ASSISTANT's response does not contain any prohibited content or content that could lead to prohibited content.\n**Safety: Unsafe**: The ASSISTANT's response contains prohibited content.\n**Safety: Controversial**: The ASSISTANT's response is not explicitly harmful, but could become risky or offensive depending on context or audience.\n<END SAFETY POLICY>\n\n<BEGIN UNSAFE CONTENT CATEGORIES>\nViolent.\nNon-violent Illegal Acts.\nSexual Content or Sexual Acts.\nPII.\nSuicide & Self-Harm.\nUnethical Acts.\nPolitically Sensitive Topics.\nCopyright Violation.\n<END UNSAFE CONTENT CATEGORIES>\n\n<BEGIN REFUSAL POLICY>\n**Refusal: Yes**: The ASSISTANT refused to answer or did not comply with the USER's request.\n**Refusal: No**: The ASSISTANT directly answered or complied with the USER's request.\n<END REFUSAL POLICY>\n\n<BEGIN CONVERSATION>\n\nUSER: {USER_TEXT}\n\nASSISTANT: {ASSISTANT_TEXT}\n\n<END CONVERSATION>\n\nProvide your safety assessment for ONLY THE LAST **ASSISTANT's response** in the above conversation:\n - The first line must be one of: 'Safety: Safe', 'Safety: Unsafe', 'Safety: Controversial'.\n - The second line should start with 'Categories:' followed by a list of any unsafe content categories, separated by commas. If the content is safe, use 'Categories: None'.\n - The third line must be one of: 'Refusal: Yes', 'Refusal: No'.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
LLAMA_PROMPT = " <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTask: Check if there is unsafe content in 'User' messages in conversations according our safety policy with the below categories.\n\n<BEGIN UNSAFE CONTENT CATEGORIES>\nS1: Violent Crimes.\nS2: Non-Violent Crimes.\nS3: Sex Crimes.\nS4: Child Exploitation.\nS5: Defamation.\nS6: Specialized Advice.\nS7: Privacy.\nS8: Intellectual Property.\nS9: Indiscriminate Weapons.\nS10: Hate.\nS11: Self-Harm.\nS12: Sexual Content.\nS13: Elections.\nS14: Code Interpreter Abuse.\n<END UNSAFE CONTENT CATEGORIES>\n\n<BEGIN CONVERSATION>\n\nUser: {USER_TEXT}\n\n<END CONVERSATION>\n\nProvide your safety assessment for ONLY THE LAST User message in the above conversation:\n - First line must read 'safe' or 'unsafe'.\n - If unsafe, a second line must include a comma-separated list of violated categories.<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
LLAMA_RESPONSE = " <|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nTask: Check if there is unsafe content in 'Agent' messages in conversations according our safety policy with the below categories.\n\n<BEGIN UNSAFE CONTENT CATEGORIES>\nS1: Violent Crimes.\nS2: Non-Violent Crimes.\nS3: Sex Crimes.\nS4: Child Exploitation.\nS5: Defamation.\nS6: Specialized Advice.\nS7: Privacy.\nS8: Intellectual Property.\nS9: Indiscriminate Weapons.\nS10: Hate.\nS11: Self-Harm.\nS12: Sexual Content.\nS13: Elections.\nS14: Code Interpreter Abuse.\n<END UNSAFE CONTENT CATEGORIES>\n\n<BEGIN CONVERSATION>\n\nUser: {USER_TEXT}\n\nAgent: {ASSISTANT_TEXT}\n\n<END CONVERSATION>\n\nProvide your safety assessment for ONLY THE LAST Agent message in the above conversation:\n - First line must read 'safe' or 'unsafe'.\n - If unsafe, a second line must include a comma-separated list of violated categories.<|eot_id|><|start_header_id|>assistant<|end_header_id|>"
GEMMA_PROMPT = "<bos>You are a policy expert trying to help determine whether a user prompt is in violation of the defined safety policies.\n\n<start_of_turn>\nHuman Question: {USER_TEXT}\n<end_of_turn>\n\nOur safety principle is defined in the below:\n\n* {GUIDELINE}\n\n===\n\nDoes the human question violate the above principle? Your answer must start with 'Yes' or 'No'. And then walk through step by step to be sure we answer correctly.\n\n"
GEMMA_RESPONSE = "<bos>You are a policy expert trying to help determine whether an AI response to a prompt is in violation of the defined safety policies.\n\n<start_of_turn>\nHuman Question: {USER_TEXT}\n<end_of_turn>\n<start_of_turn>\nChatbot Response: {ASSISTANT_TEXT}\n<end_of_turn>\n\nOur safety principle is defined in the below:\n\n* {GUIDELINE}\n\n===\n\nDoes the Chatbot Response violate the above principle? Your answer must  start with 'Yes' or 'No'. And then walk through step by step to be sure we answer correctly.\n\n"


def fill(template: str, user: str, assistant: str = "", guideline: str = GUIDELINE) -> str:
    """Return a spec prompt with the judged texts (and ShieldGemma's guideline) put in."""
    return (
        template.replace("{USER_TEXT}", user)
        .replace("{ASSISTANT_TEXT}", assistant)
        .replace("{GUIDELINE}", guideline)
    )


@dataclass
class Sim:
    """A running sim engine and a client for it."""

    proc: subprocess.Popen[str]
    url: str
    client: httpx.Client

    def post(self, path: str, body: Any) -> httpx.Response:
        """POST a JSON body."""
        return self.client.post(self.url + path, json=body)

    def complete(self, **body: Any) -> dict[str, Any]:
        """Return a successful /v1/completions answer."""
        response = self.post("/v1/completions", body)
        assert response.status_code == 200, response.text
        return response.json()

    def chat(self, **body: Any) -> dict[str, Any]:
        """Return a successful /v1/chat/completions answer."""
        response = self.post("/v1/chat/completions", body)
        assert response.status_code == 200, response.text
        return response.json()

    def text(self, prompt: str, **body: Any) -> str:
        """Return the text a raw completion of the prompt answers."""
        return self.complete(prompt=prompt, temperature=0, **body)["choices"][0]["text"]

    def reply(self, *messages: tuple[str, str], **body: Any) -> str:
        """Return the content a chat completion of (role, content) messages answers."""
        msgs = [{"role": role, "content": content} for role, content in messages]
        return self.chat(messages=msgs, temperature=0, **body)["choices"][0]["message"]["content"]

    def stream(self, path: str, body: Any) -> list[Any]:
        """Return a stream's events: decoded JSON chunks, then the "[DONE]" string."""
        with self.client.stream("POST", self.url + path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            return [
                line[len("data: ") :] if line == "data: [DONE]" else json.loads(line[6:])
                for line in r.iter_lines()
                if line.startswith("data: ")
            ]

    def stop(self) -> int:
        """Send SIGTERM and return the exit code."""
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def launch(*args: str, env: dict[str, str] | None = None, port: str = "0") -> Sim:
    """Start ``python -m agent.sim`` and wait for the line saying where it listens."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.sim", "--host", "127.0.0.1", "--port", port, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = re.search(r"listening on (http://\S+)", line)
    if not found:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the sim did not start: {line!r}")
    return Sim(proc, found.group(1), httpx.Client(timeout=30))


@pytest.fixture(scope="module")
def start_sim() -> Iterator[Callable[..., Sim]]:
    """Return a function starting sims; at the end each must exit 0 on SIGTERM."""
    started: list[Sim] = []

    def start(*args: str, **kwargs: Any) -> Sim:
        server = launch(*args, **kwargs)
        started.append(server)
        return server

    yield start
    assert [s.stop() for s in started] == [0] * len(started)


FAST = ("--ttft", "0.01", "--tps", "1000")


@pytest.fixture(scope="module")
def plain(start_sim: Callable[..., Sim]) -> Sim:
    """A plain model with a 512-token context."""
    return start_sim("--model", "sim-chat", "--context-length", "512", *FAST)


@pytest.fixture(scope="module")
def qwen(start_sim: Callable[..., Sim]) -> Sim:
    """A Qwen3Guard judge with no categories configured."""
    return start_sim("--model", "judge", "--guard-format", "qwen3guard", *FAST)


@pytest.fixture(scope="module")
def llama(start_sim: Callable[..., Sim]) -> Sim:
    """A Llama Guard 3 judge whose first category is Hate (S10)."""
    return start_sim(
        "--model",
        "judge",
        "--guard-format",
        "llamaguard3",
        "--guard-categories",
        "Hate,Violent Crimes",
        *FAST,
    )


@pytest.fixture(scope="module")
def gemma(start_sim: Callable[..., Sim]) -> Sim:
    """A ShieldGemma judge."""
    return start_sim("--model", "judge", "--guard-format", "shieldgemma", *FAST)


@pytest.fixture(scope="module")
def jsonguard(start_sim: Callable[..., Sim]) -> Sim:
    """A json-format judge, categories "violence,hate"."""
    return start_sim(
        "--model", "judge", "--guard-format", "json", "--guard-categories", "violence, hate", *FAST
    )


def only_tokens(events: list[Any]) -> list[str]:
    """Return the text each completion chunk carries."""
    return [e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"]]


# -- process and plain endpoints ----------------------------------------------------------


def test_help_names_every_option() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agent.sim", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0
    for flag in (
        "--host", "--port", "--model", "--ttft", "--tps", "--load-time", "--guard-format",
        "--guard-categories", "--unsafe-marker", "--controversial-marker", "--context-length",
        "--parallel", "--slowdown", "--logprob-style", "--fail-every", "--api-key",
    ):  # fmt: skip
        assert flag in done.stdout


def test_health_is_503_while_loading_then_200(start_sim: Callable[..., Sim]) -> None:
    server = start_sim("--model", "m", "--load-time", "1", *FAST)
    loading = server.client.get(server.url + "/health")
    assert loading.status_code == 503
    assert loading.json() == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }
    assert server.post("/v1/completions", {"prompt": "hi"}).status_code == 503
    (card,) = server.client.get(server.url + "/v1/models").json()["data"]
    assert card["meta"] is None
    for _ in range(200):
        ready = server.client.get(server.url + "/health")
        if ready.status_code == 200:
            break
        assert ready.status_code == 503
        time.sleep(0.05)
    assert ready.status_code == 200
    # With its load: a simulated node's agent reads it for its cards' utilisation.
    assert ready.json() == {"status": "ok", "slots_busy": 0, "slots_total": 4}
    assert server.text("hi", max_tokens=2)


def test_models_and_props_give_the_context_length(plain: Sim) -> None:
    models = plain.client.get(plain.url + "/v1/models").json()
    assert models["object"] == "list"
    (card,) = models["data"]
    assert card["id"] == "sim-chat"
    assert card["max_model_len"] == 512
    assert card["meta"]["n_ctx_train"] == 512
    props = plain.client.get(plain.url + "/props").json()
    assert props["default_generation_settings"]["n_ctx"] == 512


def test_options_fall_back_to_the_environment(start_sim: Callable[..., Sim]) -> None:
    server = start_sim(*FAST, env={"LLMGW_SIM_MODEL": "from-env", "LLMGW_SIM_CONTEXT_LENGTH": "99"})
    (card,) = server.client.get(server.url + "/v1/models").json()["data"]
    assert (card["id"], card["max_model_len"]) == ("from-env", 99)


def test_fail_every_answers_500_to_every_nth_generation(start_sim: Callable[..., Sim]) -> None:
    server = start_sim("--model", "m", *FAST, env={"LLMGW_SIM_FAIL_EVERY": "3"})
    statuses = [server.post("/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
                            ).status_code for _ in range(6)]  # fmt: skip
    assert statuses == [200, 200, 500, 200, 200, 500]
    failed = server.post("/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert failed.status_code == 200  # the 7th
    assert server.client.get(server.url + "/health").status_code == 200  # never failed


def test_api_key_refuses_every_call_without_it_but_health(start_sim: Callable[..., Sim]) -> None:
    key = "llmgw_engine_test-key"
    server = start_sim("--model", "m", *FAST, env={"LLMGW_SIM_API_KEY": key})
    # Not on the command line: whoever lists the node's processes does not see it.
    assert key not in " ".join(server.proc.args)
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    calls = [("POST", "/v1/chat/completions", chat), ("POST", "/v1/completions",
             {"prompt": "hi", "max_tokens": 2}), ("POST", "/tokenize", {"content": "hi"}),
             ("GET", "/v1/models", None), ("GET", "/props", None), ("GET", "/sim/stats", None),
             ("POST", "/v1/embeddings", {"input": "hi"})]  # fmt: skip
    for wrong in (None, "Bearer nope", f"Bearer {key}x", key, f"bearer {key}"):
        headers = {"Authorization": wrong} if wrong else {}
        for method, path, body in calls:
            answer = server.client.request(method, server.url + path, json=body, headers=headers)
            assert (answer.status_code, answer.json()) == (401, {"error": "Unauthorized"}), (
                wrong, path)  # fmt: skip
    # Health answers anyone, as llama-server's, vLLM's and SGLang's do.
    assert server.client.get(server.url + "/health").status_code == 200
    assert server.client.get(server.url + "/v1/health").status_code == 200
    good = {"Authorization": f"Bearer {key}"}
    for method, path, body in calls:
        answer = server.client.request(method, server.url + path, json=body, headers=good)
        assert answer.status_code == 200, (path, answer.text)


def test_tokenize_speaks_llama_server_and_vllm(plain: Sim) -> None:
    text = "Hello, world!\n\n  It's <|im_end|> 42."
    llama = plain.post("/tokenize", {"content": text, "add_special": False, "with_pieces": True})
    pieces = llama.json()["tokens"]
    assert "".join(p["piece"] for p in pieces) == text
    assert "<|im_end|>" in [p["piece"] for p in pieces]
    vllm = plain.post("/tokenize", {"model": "sim-chat", "prompt": text, "return_token_strs": True})
    answer = vllm.json()
    assert answer["tokens"] == [p["id"] for p in pieces]
    assert answer["token_strs"] == [p["piece"] for p in pieces]
    assert answer["count"] == len(pieces)
    assert answer["max_model_len"] == 512
    plain_text = plain.post("/tokenize", {"content": text, "parse_special": False}).json()
    assert plain_text["count"] > answer["count"]
    back = plain.post("/detokenize", {"tokens": answer["tokens"]}).json()
    assert back["content"] == back["prompt"] == text


def test_tokenize_counts_what_completions_count(plain: Sim) -> None:
    prompt = "Count me: one, two, three.\nAnd four."
    count = plain.post("/tokenize", {"content": prompt}).json()["count"]
    assert plain.complete(prompt=prompt, max_tokens=1)["usage"]["prompt_tokens"] == count
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]
    chat_count = plain.post("/tokenize", {"messages": messages}).json()["count"]
    assert plain.chat(messages=messages, max_tokens=1)["usage"]["prompt_tokens"] == chat_count
    rendered = plain.post("/apply-template", {"messages": messages}).json()["prompt"]
    assert plain.post("/tokenize", {"content": rendered}).json()["count"] == chat_count
    ids = plain.post("/tokenize", {"content": prompt}).json()["tokens"]
    by_ids = plain.complete(prompt=ids, max_tokens=3)
    assert by_ids["usage"]["prompt_tokens"] == count
    assert by_ids["choices"][0]["text"] == plain.text(prompt, max_tokens=3)


# -- generation ---------------------------------------------------------------------------


def test_completion_stops_at_max_tokens_or_its_end(plain: Sim) -> None:
    short = plain.complete(prompt="Tell me a story", max_tokens=5)
    (choice,) = short["choices"]
    assert short["object"] == "text_completion"
    assert choice["finish_reason"] == "length"
    assert short["usage"]["completion_tokens"] == 5
    assert short["usage"]["total_tokens"] == short["usage"]["prompt_tokens"] + 5
    assert plain.post("/tokenize", {"content": choice["text"]}).json()["count"] == 5
    assert plain.text("Tell me a story", max_tokens=5) == choice["text"]
    whole = plain.complete(prompt="Tell me a story", max_tokens=400)
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert 5 < whole["usage"]["completion_tokens"] < 400
    assert whole["choices"][0]["text"].startswith(choice["text"])
    assert whole["choices"][0]["text"].endswith(".")
    assert plain.text("Another prompt", max_tokens=400) != whole["choices"][0]["text"]


def test_stop_strings_cut_the_text_before_them(plain: Sim) -> None:
    full = plain.text("Write on", max_tokens=400)
    stop = " " + full.split()[4]
    expected = full[: full.index(stop)]
    cut = plain.complete(prompt="Write on", max_tokens=400, stop=[stop, "never there"])
    assert cut["choices"][0]["text"] == expected
    assert cut["choices"][0]["finish_reason"] == "stop"
    streamed = plain.stream(
        "/v1/completions", {"prompt": "Write on", "max_tokens": 400, "stop": stop}
    )
    assert "".join(only_tokens(streamed)) == expected
    assert streamed[-2]["choices"][0]["finish_reason"] == "stop"
    mid_word = full[len(expected) + 3 : len(expected) + 5]
    assert plain.text("Write on", max_tokens=400, stop=mid_word) == full[: full.index(mid_word)]


def test_completion_stream_sends_a_chunk_per_token_then_done(plain: Sim) -> None:
    body = {"prompt": "Stream this", "max_tokens": 6}
    events = plain.stream("/v1/completions", body)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert len(chunks) == 6
    assert all(c["object"] == "text_completion" and c["choices"][0]["text"] for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * 5 + ["length"]
    assert "".join(only_tokens(chunks)) == plain.text("Stream this", max_tokens=6)


def test_chat_answers_whole_and_streamed(plain: Sim) -> None:
    messages = [{"role": "user", "content": "Hi there"}]
    whole = plain.chat(messages=messages, max_tokens=4)
    (choice,) = whole["choices"]
    assert whole["object"] == "chat.completion"
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] == "length"
    assert whole["usage"]["completion_tokens"] == 4
    events = plain.stream(
        "/v1/chat/completions",
        {"messages": messages, "max_tokens": 4, "stream_options": {"include_usage": True}},
    )
    assert events[-1] == "[DONE]"
    role, *tokens, usage = events[:-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 4
    assert all(t["object"] == "chat.completion.chunk" for t in tokens)
    assert (
        "".join(t["choices"][0]["delta"]["content"] for t in tokens) == choice["message"]["content"]
    )
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"] == whole["usage"]
    natural = plain.chat(messages=messages, max_completion_tokens=400)
    assert natural["choices"][0]["finish_reason"] == "stop"


def test_a_prompt_longer_than_the_context_is_refused(plain: Sim) -> None:
    long_prompt = "word " * 600
    refused = plain.post("/v1/completions", {"prompt": long_prompt, "max_tokens": 5})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert "maximum context length is 512 tokens" in error["message"]
    assert (error["n_ctx"], error["type"]) == (512, "exceed_context_size_error")
    chat = plain.post(
        "/v1/chat/completions", {"messages": [{"role": "user", "content": long_prompt}]}
    )
    assert chat.status_code == 400
    near = plain.complete(prompt="word " * 495, max_tokens=400)
    assert near["choices"][0]["finish_reason"] == "length"
    assert near["usage"]["total_tokens"] == 512


def test_bad_requests_get_clear_errors(plain: Sim) -> None:
    bad_json = plain.client.post(plain.url + "/v1/completions", content=b'{"prompt": ')
    assert bad_json.status_code == 400
    assert "Invalid JSON" in bad_json.json()["error"]["message"]
    assert plain.post("/v1/completions", ["not", "an", "object"]).status_code == 400
    assert plain.client.get(plain.url + "/v2/nothing").status_code == 404
    assert plain.client.get(plain.url + "/v1/completions").status_code == 405
    for body in (
        {"prompt": "x", "max_tokens": -1},
        {"prompt": "x", "n": 2},
        {"prompt": "x", "stop": 3},
        {"prompt": "x", "logprobs": 21},
        {"prompt": ["a", "b"]},
        {"prompt": 7},
    ):
        assert plain.post("/v1/completions", body).status_code == 400, body
    no_logprobs = {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}
    assert plain.post("/v1/chat/completions", no_logprobs).status_code == 400
    assert plain.post("/v1/chat/completions", {"messages": []}).status_code == 400


# -- pacing and parallelism ---------------------------------------------------------------


async def _streams(url: str, count: int, max_tokens: int) -> list[tuple[int, str]]:
    """Run streaming completions at once; return (request, event) in order of arrival."""
    arrivals: list[tuple[int, str]] = []

    async def one(client: httpx.AsyncClient, index: int) -> None:
        body = {"prompt": f"request {index}", "max_tokens": max_tokens, "stream": True}
        async with client.stream("POST", url + "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line == "data: [DONE]":
                    arrivals.append((index, "done"))
                elif line.startswith("data: "):
                    arrivals.append((index, "token"))

    async with httpx.AsyncClient(timeout=30) as client:
        await asyncio.gather(*(one(client, i) for i in range(count)))
    return arrivals


def test_four_parallel_streams_run_together(start_sim: Callable[..., Sim]) -> None:
    server = start_sim("--model", "m", "--parallel", "4", "--ttft", "0.05", "--tps", "50")
    arrivals = asyncio.run(_streams(server.url, 4, 20))
    for index in range(4):
        mine = [event for who, event in arrivals if who == index]
        assert mine == ["token"] * 20 + ["done"]
    first_tokens = [arrivals.index((i, "token")) for i in range(4)]
    first_done = min(arrivals.index((i, "done")) for i in range(4))
    assert max(first_tokens) < first_done


def test_requests_beyond_parallel_wait_their_turn(start_sim: Callable[..., Sim]) -> None:
    server = start_sim("--model", "m", "--parallel", "1", "--ttft", "0.05", "--tps", "200")
    arrivals = asyncio.run(_streams(server.url, 2, 8))
    order = [who for who, _ in arrivals]
    first = order[0]
    assert order == [first] * 9 + [1 - first] * 9
    assert arrivals[8] == (first, "done")


def test_a_client_that_goes_away_frees_its_slot(start_sim: Callable[..., Sim]) -> None:
    server = start_sim("--model", "m", "--parallel", "1", "--ttft", "0", "--tps", "100")
    body = {"prompt": "long", "max_tokens": 3000, "stream": True}
    with server.client.stream("POST", server.url + "/v1/completions", json=body) as response:
        assert next(response.iter_lines()).startswith("data: ")
    # Were the slot still held, this would wait out the 30 s stream and time out.
    quick = httpx.post(
        server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, timeout=10
    )
    assert quick.json()["choices"][0]["finish_reason"] == "length"


# -- logprobs -----------------------------------------------------------------------------


def test_completion_logprobs_in_vllms_shape(plain: Sim) -> None:
    answer = plain.complete(prompt="Probabilities", max_tokens=8, logprobs=3)
    (choice,) = answer["choices"]
    lp = choice["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert "".join(lp["tokens"]) == choice["text"]
    assert len(lp["tokens"]) == answer["usage"]["completion_tokens"] == 8
    offsets = [0]
    for token in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(token))
    assert lp["text_offset"] == offsets
    for token, logprob, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert len(top) == 3
        assert top[token] == logprob == max(top.values())
        assert sum(math.exp(v) for v in top.values()) <= 1
    streamed = plain.stream(
        "/v1/completions", {"prompt": "Probabilities", "max_tokens": 8, "logprobs": 3}
    )
    assert [c["choices"][0]["logprobs"]["tokens"][0] for c in streamed[:-1]] == lp["tokens"]


def test_completion_logprobs_in_llama_servers_shape(start_sim: Callable[..., Sim]) -> None:
    server = start_sim("--model", "m", "--logprob-style", "llamacpp", *FAST)
    answer = server.complete(prompt="Probabilities", max_tokens=8, logprobs=3)
    (choice,) = answer["choices"]
    content = choice["logprobs"]["content"]
    assert set(choice["logprobs"]) == {"content"}
    assert "".join(entry["token"] for entry in content) == choice["text"]
    ids = server.post("/tokenize", {"content": choice["text"]}).json()["tokens"]
    assert [entry["id"] for entry in content] == ids
    for entry in content:
        assert set(entry) == {"id", "token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        best = entry["top_logprobs"][0]
        assert (best["id"], best["token"], best["logprob"]) == (
            entry["id"],
            entry["token"],
            entry["logprob"],
        )
        assert all(set(top) == {"id", "token", "logprob", "bytes"} for top in entry["top_logprobs"])


def test_chat_logprobs_in_openais_shape(plain: Sim) -> None:
    answer = plain.chat(
        messages=[{"role": "user", "content": "hi"}], max_tokens=5, logprobs=True, top_logprobs=2
    )
    (choice,) = answer["choices"]
    content = choice["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert [t["token"] for t in entry["top_logprobs"]][0] == entry["token"]
        assert len(entry["top_logprobs"]) == 2
    bare = plain.chat(messages=[{"role": "user", "content": "hi"}], max_tokens=2, logprobs=True)
    assert all(e["top_logprobs"] == [] for e in bare["choices"][0]["logprobs"]["content"])


# -- guard formats ------------------------------------------------------------------------


def test_chat_templates_render_the_specs_prompts(qwen: Sim, llama: Sim, gemma: Sim) -> None:
    def render(server: Sim, *messages: tuple[str, str], **kwargs: Any) -> str:
        msgs = [{"role": r, "content": c} for r, c in messages]
        body = {"messages": msgs, "chat_template_kwargs": kwargs}
        return server.post("/apply-template", body).json()["prompt"]

    user, agent = ("user", "{USER_TEXT}"), ("assistant", "{ASSISTANT_TEXT}")
    assert render(qwen, user) == QWEN_PROMPT
    assert render(qwen, user, agent) == QWEN_RESPONSE
    assert render(llama, user) == LLAMA_PROMPT
    assert render(llama, user, agent) == LLAMA_RESPONSE
    assert render(gemma, user, guideline="{GUIDELINE}") == GEMMA_PROMPT
    assert render(gemma, user, agent, guideline="{GUIDELINE}") == GEMMA_RESPONSE


def test_qwen3guard_answers(qwen: Sim) -> None:
    prompt, response = QWEN_PROMPT, QWEN_RESPONSE
    assert qwen.text(fill(prompt, "Hello there")) == "Safety: Safe\nCategories: None"
    assert qwen.text(fill(prompt, f"{QWEN_USER} {MARKER}")) == "Safety: Unsafe\nCategories: Violent"
    assert (
        qwen.text(fill(prompt, f"Who won? {CONTROVERSIAL}"))
        == "Safety: Controversial\nCategories: Violent"
    )
    assert (
        qwen.text(fill(response, f"{QWEN_USER} {MARKER}", QWEN_REFUSAL))
        == "Safety: Safe\nCategories: None\nRefusal: Yes"
    )
    assert (
        qwen.text(fill(response, "How?", f"Like this: {MARKER}"))
        == "Safety: Unsafe\nCategories: Violent\nRefusal: No"
    )
    assert qwen.text(fill(prompt, MARKER.lower())) == "Safety: Safe\nCategories: None"
    assert qwen.reply(("user", f"x {MARKER}")) == "Safety: Unsafe\nCategories: Violent"
    assert (
        qwen.reply(("user", f"x {MARKER}"), ("assistant", "Sure, here it is."))
        == "Safety: Safe\nCategories: None\nRefusal: No"
    )
    assert qwen.reply(("user", CONTROVERSIAL)) == "Safety: Controversial\nCategories: Violent"


def test_qwen3guard_verdict_logprobs(qwen: Sim) -> None:
    answer = qwen.complete(prompt=fill(QWEN_PROMPT, MARKER) + "Safety:", max_tokens=1, logprobs=3)
    (choice,) = answer["choices"]
    assert (choice["text"], choice["finish_reason"]) == (" Unsafe", "length")
    top = choice["logprobs"]["top_logprobs"][0]
    assert math.exp(top[" Unsafe"]) == pytest.approx(0.99)
    assert math.exp(top[" Safe"]) == pytest.approx(0.01, rel=0.02)
    assert " Controversial" in top
    whole = qwen.complete(prompt=fill(QWEN_PROMPT, "fine"), logprobs=2)["choices"][0]
    lp = whole["logprobs"]
    assert "".join(lp["tokens"]) == whole["text"] == "Safety: Safe\nCategories: None"
    at = lp["tokens"].index(" Safe")
    assert math.exp(lp["top_logprobs"][at][" Unsafe"]) == pytest.approx(0.01, rel=0.02)


def test_llamaguard3_answers(llama: Sim) -> None:
    prompt, response = LLAMA_PROMPT, LLAMA_RESPONSE
    # The template ends at the assistant header: the model writes "\n\n" first.
    assert llama.text(fill(prompt, f"Do it {MARKER}")) == "\n\nunsafe\nS10"
    assert llama.text(fill(prompt, "Hello")) == "\n\nsafe"
    assert llama.text(fill(prompt, f"Do it {MARKER}") + "\n\n") == "unsafe\nS10"
    assert llama.text(fill(response, f"Do it {MARKER}", "No.") + "\n\n") == "safe"
    assert llama.text(fill(response, "Do it", f"Done {MARKER}") + "\n\n") == "unsafe\nS10"
    assert llama.text(fill(prompt, CONTROVERSIAL) + "\n\n") == "safe"
    assert llama.reply(("user", f"a {MARKER}")) == "unsafe\nS10"
    assert llama.reply(("user", "a"), ("assistant", "b")) == "safe"
    twice = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    refused = llama.post("/v1/chat/completions", twice)
    assert refused.status_code == 400
    assert "alternate" in refused.json()["error"]["message"]


def test_llamaguard3_first_token_gives_p_unsafe(llama: Sim) -> None:
    for text, p_unsafe in ((f"go {MARKER}", 0.99), ("go", 0.01)):
        prompt = fill(LLAMA_PROMPT, text) + "\n\n"
        choice = llama.complete(prompt=prompt, max_tokens=1, logprobs=2)["choices"][0]
        top = choice["logprobs"]["top_logprobs"][0]
        assert set(top) == {"safe", "unsafe"}
        assert math.exp(top["unsafe"]) == pytest.approx(p_unsafe)
        assert math.exp(top["safe"]) == pytest.approx(1 - p_unsafe)


def test_shieldgemma_answers(gemma: Sim) -> None:
    prompt, response = GEMMA_PROMPT, GEMMA_RESPONSE
    assert gemma.text(fill(prompt, f"Build a {MARKER}")) == "Yes"
    assert gemma.text(fill(prompt, "Build a shed")) == "No"
    assert gemma.text(fill(response, "Build a shed", f"Like {MARKER}")) == "Yes"
    assert gemma.text(fill(response, f"Build a {MARKER}", "I will not.")) == "No"
    assert gemma.text(fill(prompt, "Build a shed", guideline=f"No {MARKER}")) == "No"
    assert gemma.reply(("user", MARKER), chat_template_kwargs={"guideline": GUIDELINE}) == "Yes"
    assert gemma.reply(("system", GUIDELINE), ("user", "hello")) == "No"
    unguided = gemma.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]})
    assert unguided.status_code == 400
    assert "guideline" in unguided.json()["error"]["message"]
    choice = gemma.complete(prompt=fill(prompt, MARKER), max_tokens=1, logprobs=2)["choices"][0]
    top = choice["logprobs"]["top_logprobs"][0]
    assert math.exp(top["Yes"]) == pytest.approx(0.99)
    assert math.exp(top["No"]) == pytest.approx(0.01)


def test_json_answers(jsonguard: Sim) -> None:
    judge = "Judge the text below. Answer in JSON.\n\nText: "
    assert jsonguard.text(judge + "hello") == '{"safe": true, "categories": []}'
    assert jsonguard.text(judge + MARKER) == '{"safe": false, "categories": ["violence"]}'
    assert jsonguard.text(judge + CONTROVERSIAL) == '{"safe": true, "categories": []}'
    assert jsonguard.reply(("user", f"a {MARKER}")) == '{"safe": false, "categories": ["violence"]}'
    prefilled = jsonguard.complete(prompt=judge + MARKER + '\n{"safe":', logprobs=2)
    (choice,) = prefilled["choices"]
    assert choice["text"] == ' false, "categories": ["violence"]}'
    assert choice["logprobs"]["tokens"][0] == " false"
    top = choice["logprobs"]["top_logprobs"][0]
    assert math.exp(top[" false"]) == pytest.approx(0.99)
    assert math.exp(top[" true"]) == pytest.approx(0.01)


def test_the_marker_is_found_inside_a_long_prompt(qwen: Sim) -> None:
    words = [f"w{i}" for i in range(1500)]
    words[900] = MARKER
    text = " ".join(words)
    answer = qwen.complete(prompt=fill(QWEN_PROMPT, text))
    assert answer["usage"]["prompt_tokens"] > 1500
    assert answer["choices"][0]["text"] == "Safety: Unsafe\nCategories: Violent"
    assert qwen.reply(("user", text)) == "Safety: Unsafe\nCategories: Violent"
    # Only the last turn is judged, as the template asks.
    assert qwen.reply(("user", text), ("assistant", "ok")).startswith("Safety: Safe")


def test_guard_answers_stream_like_any_text(llama: Sim) -> None:
    prompt = fill(LLAMA_PROMPT, MARKER)
    events = llama.stream("/v1/completions", {"prompt": prompt, "logprobs": 1})
    tokens = only_tokens(events[:-1])
    assert tokens == ["\n\n", "unsafe", "\n", "S10"]
    assert events[-2]["choices"][0]["finish_reason"] == "stop"


def test_guard_categories_follow_the_template_lists() -> None:
    cfg = simconfig.Config(
        model="m", guard_format="qwen3guard", guard_categories=("Jailbreak", "PII")
    )
    asked = simguard.Judged(MARKER, response=False)
    answered = simguard.Judged(MARKER, response=True)
    assert simguard.verdict(cfg, asked, raw=False).text == "Safety: Unsafe\nCategories: Jailbreak"
    assert (
        simguard.verdict(cfg, answered, raw=False).text
        == "Safety: Unsafe\nCategories: PII\nRefusal: No"
    )
    llama = simconfig.Config(
        model="m", guard_format="llamaguard3", guard_categories=("Suicide & Self-Harm",)
    )
    assert simguard.verdict(llama, asked, raw=False).text == "unsafe\nS11"
    by_code = simconfig.Config(model="m", guard_format="llamaguard3", guard_categories=("s9",))
    assert simguard.verdict(by_code, asked, raw=False).text == "unsafe\nS9"


# -- stopping -----------------------------------------------------------------------------


def test_sigterm_ends_the_process_with_0_even_mid_stream() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = launch("--model", "m", "--ttft", "0", "--tps", "5", port=str(port))
    assert server.url == f"http://127.0.0.1:{port}"
    with server.client.stream(
        "POST",
        server.url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 100, "stream": True},
    ) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        assert server.stop() == 0


# -- units --------------------------------------------------------------------------------


@given(st.text(), st.booleans())
def test_tokens_concatenate_to_the_text(text: str, parse_special: bool) -> None:
    assert "".join(simtext.tokenize(text, parse_special)) == text


@given(
    st.lists(st.sampled_from(["a", " b", "c.", "\n", " dd"]), max_size=30),
    st.integers(0, 40),
    st.lists(st.sampled_from(["b", "c.", "\n d", " d", "zz"]), max_size=3),
)
def test_a_plan_never_emits_a_stop_string(pieces: list[str], limit: int, stops: list[str]) -> None:
    steps = simtext.plan(pieces, limit, stops)
    emitted = "".join(steps.pieces)
    assert "".join(pieces).startswith(emitted)
    assert not any(stop in emitted for stop in stops)
    assert all(steps.pieces)
    assert steps.generated <= min(limit, len(pieces))
    assert steps.finish in ("stop", "length")
