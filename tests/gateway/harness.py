"""A gateway process's request path over real sockets, with engines that misbehave on cue.

``Harness`` runs, on one event loop in a thread of its own: ``Engine`` servers (real HTTP
servers speaking the engines' OpenAI API, each told what to do: answer, stream, answer
503 or 429, close mid-stream, be slow) and the real ``gateway.path.app.Gateway`` under real
uvicorn, routing by a table built from plain data (``gateway.path.table.build``) as the state
would build it from the database. Clients are the official ``openai`` package and httpx.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from catalog import spec
from gateway.path.app import Gateway, Options
from gateway.path.limits import LocalLimits
from gateway.path.table import Key, ReplicaRow, Table, build, digest
from gateway.records.state import State
from tests.waiting import wait_until

KEY = "llmgw-ck-harness-key"


@dataclass
class Engine:
    """One engine: how it answers, and what it saw."""

    name: str
    # ok | 503 | 429 | refuse | cut | slow | tools | toolname | garbled | nested | stall | vllm (a
    # stream's role chunk written with its first token, after first_token_delay, as vLLM
    # and llama-server send it once the prefill is done)
    behaviour: str = "ok"
    say: str = ""  # the answer's words, when given (else NAME0 NAME1 ...)
    words: int = 5
    delay: float = 0.0  # before the answer's head
    # A stream's head and a chunk with only the role at once, then this long before the
    # first token (as a prefill takes); "stall" waits it after the second word instead.
    first_token_delay: float = 0.0
    pace: float = 0.0  # between a stream's words (as an engine generates them)
    port: int = 0
    requests: int = 0
    connections: int = 0
    cancelled: int = 0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    server: asyncio.base_events.Server | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
                }
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.requests += 1
                self.auth.append(headers.get("authorization", ""))
                data = json.loads(body) if body else {}
                self.bodies.append(data)
                path = lines[0].split()[1]
                if not await self._answer(path, data, reader, writer):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _message(self, words: list[str]) -> dict[str, Any]:
        return _message_of(self.behaviour, words)

    async def _answer(self, path: str, data: dict[str, Any], reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:  # fmt: skip
        if self.behaviour in ("503", "429", "400"):
            body = json.dumps({"error": {"message": "busy"}}).encode()
            if self.behaviour == "400":  # as vLLM refuses what it does not take
                body = json.dumps({"object": "error", "message": "Only n=1 is supported",
                                   "type": "BadRequestError", "param": None, "code": 400}).encode()  # fmt: skip
            writer.write(f"HTTP/1.1 {self.behaviour} X\r\nContent-Length: {len(body)}\r\n"
                         "Content-Type: application/json\r\n\r\n".encode() + body)  # fmt: skip
            await writer.drain()
            return True
        if path == "/tokenize":
            text = data.get("content") or ""
            body = json.dumps({"tokens": list(range(len(text.split())))}).encode()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
            return True
        words = self.say.split() if self.say else [f"{self.name}{i}" for i in range(self.words)]
        if self.delay:
            await asyncio.sleep(self.delay)
        if not data.get("stream"):
            if self.behaviour == "slow":
                # A whole answer that takes long: a client that goes away must stop it.
                for _ in range(200):
                    await asyncio.sleep(0.05)
                    if reader.at_eof():
                        self.cancelled += 1
                        return False
            body = json.dumps({
                "id": "x", "object": "chat.completion", "created": 1, "model": data.get("model"),
                "choices": [{"index": 0, "message": self._message(words), "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(words), "total_tokens": 3 + len(words)},
            }).encode()  # fmt: skip
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)  # fmt: skip
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip

        def chunk(event: dict[str, Any] | str) -> bytes:
            raw = event if isinstance(event, str) else json.dumps(event)
            payload = f"data: {raw}\n\n".encode()
            return b"%x\r\n" % len(payload) + payload + b"\r\n"

        lead = b""  # written with the first token
        if self.behaviour == "vllm":
            if not await self._sleep(self.first_token_delay, reader):
                return False
            lead = chunk({"id": "x", "object": "chat.completion.chunk", "created": 1,
                          "choices": [{"index": 0, "finish_reason": None,
                                       "delta": {"role": "assistant", "content": ""}}]})  # fmt: skip
        elif self.first_token_delay and self.behaviour != "stall":
            writer.write(chunk({"id": "x", "object": "chat.completion.chunk", "created": 1,
                                "choices": [{"index": 0, "finish_reason": None,
                                             "delta": {"role": "assistant", "content": ""}}]}))  # fmt: skip
            await writer.drain()
            if not await self._sleep(self.first_token_delay, reader):
                return False
        for i, word in enumerate(words):
            stalled = self.behaviour == "stall" and i == 2
            if stalled and not await self._sleep(self.first_token_delay, reader):
                return False
            if self.behaviour == "cut" and i == 2:
                writer.transport.abort()  # killed mid-stream
                return False
            delta = {"content": (" " if i else "") + word}
            if self.behaviour == "garbled":
                # Not JSON, yet text a client would show.
                writer.write(chunk(f"{{garbled {word}"))
                await writer.drain()
                continue
            if self.behaviour == "toolname":
                # A tool call whose name carries the words, streamed as engines do: the
                # name in the call's first delta, its arguments after.
                call = {"index": 0, "id": "c1", "type": "function",
                        "function": {"name": "_".join(words), "arguments": ""}}  # fmt: skip
                for delta in ({"tool_calls": [call]},
                              {"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]}):  # fmt: skip
                    writer.write(chunk({"id": "x", "object": "chat.completion.chunk",
                                        "created": 1, "model": data.get("model"),
                                        "choices": [{"index": 0, "delta": delta,
                                                     "finish_reason": None}]}))  # fmt: skip
                    await writer.drain()
                break
            if self.behaviour == "nested":
                # One event of JSON nested deeper than a parser goes, every word inside.
                writer.write(chunk("[" * 50_000 + json.dumps(" ".join(words)) + "]" * 50_000))
                await writer.drain()
                break
            writer.write(lead + chunk({"id": "x", "object": "chat.completion.chunk",
                                       "created": 1, "model": data.get("model"),
                                       "choices": [{"index": 0, "delta": delta,
                                                    "finish_reason": None}],
                                       "usage": None}))  # fmt: skip
            lead = b""
            await writer.drain()
            if self.pace:
                await asyncio.sleep(self.pace)
            if self.behaviour == "slow":
                await asyncio.sleep(0.05)
                if reader.at_eof():
                    self.cancelled += 1
                    return False
        writer.write(chunk({"id": "x", "object": "chat.completion.chunk", "created": 1,
                            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                            "usage": None}))  # fmt: skip
        writer.write(chunk({"id": "x", "object": "chat.completion.chunk", "created": 1,
                            "choices": [], "usage": {"prompt_tokens": 3,
                            "completion_tokens": len(words), "total_tokens": 3 + len(words)}}))  # fmt: skip
        writer.write(chunk("[DONE]") + b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _sleep(self, seconds: float, reader: asyncio.StreamReader) -> bool:
        """Wait, as an engine busy generating; False (counted cancelled) when the client
        went away meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            if reader.at_eof():
                self.cancelled += 1
                return False
        return True


def _message_of(behaviour: str, words: list[str]) -> dict[str, Any]:
    if behaviour == "toolname":
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "_".join(words), "arguments": "{}"},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if behaviour == "tools":
        arguments = json.dumps({"query": " ".join(words)})
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "search", "arguments": arguments},
                }
            ],
        }
    return {"role": "assistant", "content": " ".join(words)}


class AllowAll:
    """A guard whose policy judges nothing (the harness is about routing and failures;
    the guard on the path is proved end to end in tests/e2e/test_gateway.py)."""

    def directions(self) -> tuple[bool, bool]:
        return False, False

    async def judge(self, request: str, answer: str | None = None) -> dict[str, Any]:
        raise AssertionError("nothing is judged under this policy")


def model(name: str, **kw: Any) -> spec.Model:
    # On demand by default (a model with min 0 and max 0 is switched off: never woken).
    kw.setdefault("scaling", spec.Scaling(min=0, max=1))
    m = spec.Model(name=name, source=f"sim/{name}", **kw)
    return m


class Harness:
    def __init__(self, state: State | None = None, guard: Any = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.models: list[spec.Model] = []
        self.rows: list[ReplicaRow] = []
        self.keys: dict[str, Key] = {digest(KEY): Key(1, "harness", "team:t", (), None)}
        self.demanded: list[str] = []
        self.unplaced: dict[str, str] = {}  # models placement found no room for, and why
        self.down: dict[str, str] = {}  # federated peers whose breaker is open, and why
        self.state = state or State(
            loader=self._table, interval=0.05, record_demand=self.demanded.append
        )
        self.gateway = Gateway(state=self.state, guard=guard or AllowAll(),
                               options=Options(wake_wait=1.0, first_byte_timeout=5,
                                               read_timeout=5))  # fmt: skip
        self.app: Any = self.gateway  # what uvicorn serves (a test may wrap the gateway)
        self.http: Any = "auto"  # uvicorn's HTTP protocol (a test may give gateway serve's)
        self.port = 0
        self._server: uvicorn.Server | None = None

    def _table(self) -> Table:
        return build(list(self.models), list(self.rows), dict(self.keys), dict(self.unplaced),
                     down=dict(self.down))  # fmt: skip

    def run(self, coro: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def engine(self, name: str, **kw: Any) -> Engine:
        e = Engine(name, **kw)
        self.run(e.start())
        return e

    def one_budget_minute(self) -> None:
        """The keys' budgets counted in one minute that does not end while the test runs
        (this process's own budgets, their clock held): a test of a key's ``rpm`` takes
        its requests one after another, and on a loaded machine the fixed 60 s window
        (gateway.path.limits) could start again between two of them."""
        held = time.time()
        self.gateway.limits = LocalLimits(clock=lambda: held)

    def serve(self, models: list[spec.Model], replicas: list[tuple[int, str, Engine]]) -> None:
        self.models = models
        self.rows = [ReplicaRow(rid, m, "sim", e.url) for rid, m, e in replicas]
        if self._server is None:
            config = uvicorn.Config(self.app, host="127.0.0.1", port=0, lifespan="off",
                                    log_level="warning", access_log=False,
                                    http=self.http)  # fmt: skip
            self._server = uvicorn.Server(config)
            self.loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._server.serve()))
            deadline = time.monotonic() + 10
            while not (self._server.started and self._server.servers):
                if time.monotonic() > deadline:
                    raise AssertionError("the gateway did not start")
                time.sleep(0.01)
            self.port = self._server.servers[0].sockets[0].getsockname()[1]
            self.state.start(self.loop)
        self.refresh()

    def refresh(self) -> None:
        """Have the state read the table again and wait until it has."""
        before = self.state.table
        self.state.poke()
        deadline = time.monotonic() + 5
        while self.state.table is before:
            if time.monotonic() > deadline:
                raise AssertionError("the state did not read the table again")
            time.sleep(0.005)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            time.sleep(0.2)
        self.state.stop()

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)


def wait(check: Callable[[], Any], timeout: float = 5, what: str = "condition") -> Any:
    """``tests.waiting.wait_until`` with the gateway tests' default bound."""
    return wait_until(check, timeout, what)
