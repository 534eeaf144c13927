"""Serve a simulated inference engine: the ``sim`` engine the agent runs without weights.

It speaks the OpenAI-compatible API that llama-server and vLLM speak (``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``, streaming, logprobs, ``/health``,
``/tokenize``) and writes synthetic text at a set time to first token and rate, so
everything around an engine (readiness, routing, queueing, streaming, timeouts) runs for
real on a machine with no card.

Started with ``--guard-format`` it is a judge: it finds the text the prompt asks it to
judge, calls it unsafe exactly when that text holds the unsafe marker, and answers in the
format's own grammar (see /work/shared/spec/guard-formats.md, and docs/agent-protocol.md for
the replica's ``guard`` field), with logprobs that put 0.99 on its verdict.

This module is the HTTP server, its routes and the generation slots; beside it are
``simconfig`` (the configuration and the command line: ``python -m agent.sim --help``),
``simtext`` (the tokenizer, the synthetic text, max tokens and stop strings),
``simguard`` (the guard formats' templates, what a prompt asks to judge, the verdict),
``simopenai`` (the OpenAI answer shapes, usage and logprobs), ``simnative`` (its own
``/v1/responses`` and ``/v1/messages``, made of its chat completions as vLLM's are),
``simhttp`` (reading a request, writing JSON and server-sent events), ``simweights`` (the
``--weights`` file).

Standard library only; no Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import signal
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

from agent import simchat, simnative, simweights
from agent.simcache import PrefixCache
from agent.simconfig import MAX_LOGPROBS, SIM_VERSION, Config, parse_config
from agent.simguard import (
    BadRequest,
    Judged,
    judge_chat,
    judge_raw,
    parse_messages,
    render_chat,
    verdict,
)
from agent.simhttp import HttpError, Malformed, Request, read_request, send_json, send_stream
from agent.simopenai import (
    Job,
    chunk,
    completion_prompt,
    echo_text,
    embedding_of,
    finish_reason,
    generation_options,
    ids_text,
    template_kwargs,
    usage,
    whole,
)
from agent.simtext import plan, synthetic_text, text_seed, token_id, tokenize

Result = tuple[int, Any] | AsyncIterator[dict[str, Any]] | simnative.Typed
# What answers without the key when one is set: health, as llama-server, vLLM and SGLang
# answer it (the agent's readiness check, a load balancer's).
_PUBLIC = frozenset({"/health", "/v1/health"})


class Slots:
    """The engine's generation slots (``--parallel``), counting those in use."""

    def __init__(self, n: int) -> None:
        self.free = asyncio.Semaphore(n)
        self.busy = 0

    async def __aenter__(self) -> None:
        # Unbounded here as in a real engine: a request waits for a slot while its client
        # waits; the gateway's first-byte bound (or the client's own) ends the wait, and
        # a request whose client went is cancelled, giving up its place.
        await self.free.acquire()
        self.busy += 1

    async def __aexit__(self, *exc: object) -> None:
        self.busy -= 1
        self.free.release()


class SimServer:
    """The sim engine's HTTP server: one process, one model."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.created = int(time.time())
        self.ready_at = time.monotonic() + cfg.load_time
        self.slots = Slots(cfg.parallel)
        self.connections: set[asyncio.Task[Any]] = set()
        self.routes = {
            "/health": ("GET", self.health),
            "/v1/health": ("GET", self.health),
            "/v1/models": ("GET", self.models),
            "/models": ("GET", self.models),
            "/props": ("GET", self.props),
            "/tokenize": ("POST", self.tokenize),
            "/detokenize": ("POST", self.detokenize),
            "/apply-template": ("POST", self.apply_template),
            "/v1/completions": ("POST", self.completions),
            "/completions": ("POST", self.completions),
            "/v1/chat/completions": ("POST", self.chat_completions),
            "/chat/completions": ("POST", self.chat_completions),
            "/v1/responses": ("POST", self.responses),
            "/v1/messages": ("POST", self.messages),
            "/v1/embeddings": ("POST", self.embeddings),
            "/v1/rerank": ("POST", self.rerank),
            "/rerank": ("POST", self.rerank),
            "/v2/rerank": ("POST", self.rerank),
            "/sim/stats": ("GET", self.sim_stats),
        }
        # What generation requests came to (``/sim/stats``): tests read whether a client
        # that went away (a gateway cancelling) stopped the generation.
        # Also the prompt tokens generation requests came with, and how many of them the
        # prefix cache held (agent.simcache): a replica's cache hits, for tests and benches.
        # And the requests its own Responses and Messages routes served (agent.simnative).
        self.stats = {"completed": 0, "cancelled": 0, "prompt_tokens": 0, "cached_tokens": 0,
                      "responses": 0, "messages": 0}  # fmt: skip
        self.cache = PrefixCache(cfg.prefix_cache_tokens)
        self.generations = 0  # generation requests, for --fail-every
        self.weighted = 0  # generation requests, for the weights' error rate

    # -- connections --------------------------------------------------------------------

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Answer requests on one connection until it closes or asks to."""
        task = asyncio.current_task()
        if task is not None:
            self.connections.add(task)
        try:
            while True:
                try:
                    request = await read_request(reader, writer)
                except Malformed as exc:
                    await send_json(writer, 400, HttpError(400, str(exc)).body, False)
                    break
                if request is None:
                    break
                await self.respond(request, writer)
                if not request.keep_alive:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client went away, or the server is stopping
        finally:
            if task is not None:
                self.connections.discard(task)
            writer.close()

    async def respond(self, request: Request, writer: asyncio.StreamWriter) -> None:
        """Route a request and write its answer."""
        try:
            result = await self.dispatch(request)
        except HttpError as exc:
            result = (exc.status, exc.body)
        except BadRequest as exc:
            result = (400, HttpError(400, str(exc)).body)
        except Exception as exc:  # a bug: answer 500, as an engine would, and keep serving
            traceback.print_exc(file=sys.stderr)
            result = (500, HttpError(500, f"internal error: {exc!r}", "server_error").body)
        if isinstance(result, tuple):
            await send_json(writer, result[0], result[1], request.keep_alive)
        elif isinstance(result, simnative.Typed):
            await send_stream(writer, result.events, request.keep_alive, typed=True)
        else:
            await send_stream(writer, result, request.keep_alive)

    async def dispatch(self, request: Request) -> Result:
        """Return the answer to a request: a status and JSON body, or a stream of events."""
        if self.cfg.api_key and request.path not in _PUBLIC and not self.authorized(request):
            # vLLM's and SGLang's answer, word for word.
            return 401, {"error": "Unauthorized"}
        route = self.routes.get(request.path)
        if route is None:
            raise HttpError(404, f"File Not Found: {request.path}", "not_found_error")
        method, handler = route
        if request.method != method:
            raise HttpError(405, f"Method {request.method} is not allowed on {request.path}")
        # llama-server answers these two while loading (models with a null meta).
        if handler not in (self.health, self.models) and self.loading():
            raise HttpError(503, "Loading model", "unavailable_error")
        generating = (self.chat_completions, self.completions, self.responses, self.messages)
        if self.cfg.fail_every and handler in generating:
            self.generations += 1
            if self.generations % self.cfg.fail_every == 0:
                raise HttpError(500, "simulated engine failure (--fail-every)", "server_error")
        if self.cfg.weights and handler in generating:
            self.weighted += 1
            if simweights.fails(self.cfg.weights, self.weighted):
                raise HttpError(
                    500, "simulated engine failure (weights' error_rate)", "server_error"
                )
        return await handler(request)

    def authorized(self, request: Request) -> bool:
        """Return whether the request carries the key (``Authorization: Bearer <key>``)."""
        given = request.headers.get("authorization", "").encode("latin-1", "replace")
        return hmac.compare_digest(given, f"Bearer {self.cfg.api_key}".encode("latin-1", "replace"))

    def loading(self) -> bool:
        """Return whether the simulated model is still loading."""
        return time.monotonic() < self.ready_at

    # -- plain endpoints ----------------------------------------------------------------

    async def health(self, request: Request) -> Result:
        """Answer like llama-server: 503 while loading, then 200."""
        if self.loading():
            raise HttpError(503, "Loading model", "unavailable_error")
        # Its load, which a simulated node's agent turns into its cards' utilisation
        # (agent.simcards): no card to ask.
        return 200, {
            "status": "ok",
            "slots_busy": self.slots.busy,
            "slots_total": self.cfg.parallel,
        }

    async def models(self, request: Request) -> Result:
        """List the one model, with vLLM's max_model_len and llama-server's meta (null while loading)."""
        ctx = self.cfg.context_length
        card = {
            "id": self.cfg.model,
            "object": "model",
            "created": self.created,
            "owned_by": "llmgw-sim",
            "root": self.cfg.model,
            "parent": None,
            "max_model_len": ctx,
            "meta": None
            if self.loading()
            else {"n_ctx_train": ctx, "n_vocab": 2**31, "n_params": 0, "size": 0},
        }
        return 200, {"object": "list", "data": [card]}

    async def props(self, request: Request) -> Result:
        """Answer llama-server's /props with the context size and slots."""
        return 200, {
            "default_generation_settings": {"n_ctx": self.cfg.context_length},
            "total_slots": self.cfg.parallel,
            "model_path": self.cfg.model,
            "build_info": f"llmgw-sim {SIM_VERSION}",
        }

    async def tokenize(self, request: Request) -> Result:
        """Tokenize llama-server's ``content``, vLLM's ``prompt`` or vLLM's ``messages``.

        There is no BOS token, so ``add_special`` changes nothing, and the count is the
        prompt_tokens a completion of the same text reports.
        """
        body = request.json()
        if "messages" in body:
            text = self.render(body, bool(body.get("add_generation_prompt", True)))
        else:
            text = body.get("content", body.get("prompt"))
            if not isinstance(text, str):
                raise HttpError(400, "'content' (or 'prompt') must be a string")
        pieces = tokenize(text, bool(body.get("parse_special", True)))
        ids = [token_id(p) for p in pieces]
        answer: dict[str, Any] = {
            "tokens": (
                [{"id": i, "piece": p} for i, p in zip(ids, pieces, strict=True)]
                if body.get("with_pieces")
                else ids
            ),
            "count": len(ids),
            "max_model_len": self.cfg.context_length,
        }
        if body.get("return_token_strs"):
            answer["token_strs"] = pieces
        return 200, answer

    async def detokenize(self, request: Request) -> Result:
        """Turn token ids back into text, under llama-server's and vLLM's keys."""
        text = ids_text(request.json().get("tokens"))
        return 200, {"content": text, "prompt": text}

    async def apply_template(self, request: Request) -> Result:
        """Render messages with the model's chat template, like llama-server."""
        body = request.json()
        return 200, {"prompt": self.render(body)}

    def render(self, body: dict[str, Any], add_generation_prompt: bool = True) -> str:
        """The prompt a chat body makes: a guard's format's template, or the plain
        model's ChatML with the request's tools and tool calls (agent.simchat)."""
        if self.cfg.guard_format:
            return render_chat(
                self.cfg, body.get("messages"), template_kwargs(body), add_generation_prompt
            )
        template_kwargs(body)
        return simchat.render(body.get("messages"), body.get("tools"), add_generation_prompt)

    async def sim_stats(self, request: Request) -> Result:
        """What generation requests came to: completed, and cancelled by their client."""
        return 200, dict(self.stats)

    async def embeddings(self, request: Request) -> Result:
        """Answer ``/v1/embeddings``: a unit vector of ``EMBEDDING_DIM`` numbers per input,
        the same for the same text."""
        body = request.json()
        value = body.get("input")
        inputs = [value] if isinstance(value, str) else value
        if not isinstance(inputs, list) or not inputs:
            raise HttpError(400, "'input' must be a string or a non-empty list")
        data = []
        total = 0
        for i, item in enumerate(inputs):
            text = item if isinstance(item, str) else json.dumps(item)
            total += len(tokenize(text))
            data.append({"object": "embedding", "index": i, "embedding": embedding_of(text)})
        self.stats["completed"] += 1
        return 200, {
            "object": "list",
            "data": data,
            "model": self.cfg.model,
            "usage": {"prompt_tokens": total, "total_tokens": total},
        }

    async def rerank(self, request: Request) -> Result:
        """Answer ``/v1/rerank`` (and ``/rerank``, ``/v2/rerank``) as vLLM does: results
        by relevance (agent.simchat.relevance), each with its document, cut to top_n."""
        body = request.json()
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str):
            raise HttpError(400, "'query' must be a string")
        if not isinstance(documents, list) or not documents:
            raise HttpError(400, "'documents' must be a non-empty list of strings")
        texts = [d.get("text") if isinstance(d, dict) else d for d in documents]
        if not all(isinstance(t, str) for t in texts):
            raise HttpError(400, 'each document must be a string or {"text": string}')
        top_n = body.get("top_n")
        if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int)
                                  or top_n < 1):  # fmt: skip
            raise HttpError(400, "'top_n' must be a positive integer")
        tokens = sum(len(tokenize(query)) + len(tokenize(t)) for t in texts)
        self.stats["completed"] += 1
        return 200, {
            "id": "rerank-" + uuid.uuid4().hex,
            "model": self.cfg.model,
            "usage": {"total_tokens": tokens},
            "results": simchat.rerank(query, texts, top_n),
        }

    # -- generation ---------------------------------------------------------------------

    async def completions(self, request: Request) -> Result:
        """Answer ``/v1/completions`` for a raw prompt."""
        body = request.json()
        prompt, prompt_tokens = completion_prompt(body.get("prompt"))
        top_n = body.get("logprobs")
        if top_n is not None and (
            isinstance(top_n, bool) or not isinstance(top_n, int) or not 0 <= top_n <= MAX_LOGPROBS
        ):
            raise HttpError(400, f"'logprobs' must be an integer from 0 to {MAX_LOGPROBS}")
        judged = judge_raw(self.cfg.guard_format, prompt) if self.cfg.guard_format else None
        echo = echo_text(prompt) if not self.cfg.guard_format else None
        job = self.job(
            body, False, prompt, prompt_tokens, top_n, judged, body.get("max_tokens"), echo
        )
        return await self.run(job, request.reader)

    async def chat_completions(self, request: Request) -> Result:
        """Answer ``/v1/chat/completions``."""
        return await self.run(self.chat_job(request.json()), request.reader)

    async def responses(self, request: Request) -> Result:
        """Answer ``/v1/responses`` as vLLM does: the chat completion it means, written as
        a response object or the API's events (agent.simnative; stateless)."""
        body = request.json()
        result = await self.run(self.chat_job(simnative.responses_chat(body)), request.reader)
        self.stats["responses"] += 1
        if isinstance(result, tuple):
            return result[0], simnative.response_object(body, result[1])
        assert not isinstance(result, simnative.Typed)
        return simnative.Typed(simnative.response_events(body, result))

    async def messages(self, request: Request) -> Result:
        """Answer ``/v1/messages`` as vLLM does: the chat completion it means, written as
        a message or the API's events (agent.simnative)."""
        body = request.json()
        job = self.chat_job(simnative.messages_chat(body))
        result = await self.run(job, request.reader)
        self.stats["messages"] += 1
        if isinstance(result, tuple):
            return result[0], simnative.message_object(body, result[1])
        assert not isinstance(result, simnative.Typed)
        return simnative.Typed(simnative.message_events(body, job.prompt_tokens, job.cached,
                                                        result))  # fmt: skip

    def chat_job(self, body: dict[str, Any]) -> Job:
        """A chat completion's job, its body checked."""
        prompt = self.render(body)
        top_n = None
        if body.get("logprobs"):
            top_n = body.get("top_logprobs") or 0
            if (
                isinstance(top_n, bool)
                or not isinstance(top_n, int)
                or not 0 <= top_n <= MAX_LOGPROBS
            ):
                raise HttpError(400, f"'top_logprobs' must be an integer from 0 to {MAX_LOGPROBS}")
        elif body.get("top_logprobs") is not None:
            raise HttpError(400, "'top_logprobs' needs 'logprobs' set to true")
        judged = judge_chat(body["messages"]) if self.cfg.guard_format else None
        echo = None
        calls = None
        if not self.cfg.guard_format:
            calls = simchat.calls_asked(body["messages"], body.get("tools"))
            users = [c for r, c in parse_messages(body["messages"]) if r == "user"]
            echo = echo_text(users[-1]) if users else None
            if echo is None and users and self.cfg.weights is not None:
                echo = simweights.answer(self.cfg.weights, users[-1])
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        return self.job(
            body, True, prompt, len(tokenize(prompt)), top_n, judged, max_tokens, echo, calls
        )

    def job(
        self,
        body: dict[str, Any],
        chat: bool,
        prompt: str,
        prompt_tokens: int,
        top_n: int | None,
        judged: Judged | None,
        max_tokens: Any,
        echo: str | None = None,
        calls: list[tuple[str, str, str]] | None = None,
    ) -> Job:
        """Check a generation request's options and plan what it generates."""
        ctx = self.cfg.context_length
        if prompt_tokens >= ctx:
            raise HttpError(
                400,
                f"This model's maximum context length is {ctx} tokens. However, your request "
                f"has {prompt_tokens} input tokens, which leaves no room to generate. "
                "Please reduce the length of the input.",
                "exceed_context_size_error",
                n_prompt_tokens=prompt_tokens,
                n_ctx=ctx,
            )
        stops, stream_options = generation_options(body, max_tokens)
        # A room-limited request is cut short rather than refused, as llama-server does.
        limit = ctx - prompt_tokens if max_tokens is None else min(max_tokens, ctx - prompt_tokens)
        seed = text_seed(prompt, body.get("seed"))
        answer = None
        starts: list[int] = []
        if judged is not None:
            answer = verdict(self.cfg, judged, raw=not chat)
            natural = tokenize(answer.text)
        elif calls:
            natural = []
            for _, _, arguments in calls:
                starts.append(len(natural))
                natural += tokenize(arguments)
            stops = []  # a stop string does not cut a tool call's arguments
        elif echo is not None:
            natural = tokenize(echo)
        else:
            natural = tokenize(synthetic_text(seed))
        for piece in natural:
            token_id(piece)
        steps = plan(natural, limit, stops)
        verdict_index = None
        if answer is not None and answer.token in steps.pieces:
            verdict_index = steps.pieces.index(answer.token)
        prompt_pieces = tokenize(prompt)
        cached = self.cache.lookup(prompt_pieces) if self.cache.enabled else None
        self.cache.store(prompt_pieces)
        self.stats["prompt_tokens"] += prompt_tokens
        self.stats["cached_tokens"] += cached or 0
        return Job(
            chat=chat,
            plan=steps,
            prompt_tokens=prompt_tokens,
            seed=seed,
            top_n=top_n,
            verdict=answer,
            verdict_index=verdict_index,
            stream=bool(body.get("stream")),
            include_usage=bool(stream_options.get("include_usage")),
            ident=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            created=int(time.time()),
            cached=min(cached, prompt_tokens) if cached is not None else None,
            calls=tuple(calls or ()),
            call_starts=tuple(starts),
            prompt_pieces=tuple(prompt_pieces),
        )

    async def run(self, job: Job, reader: asyncio.StreamReader | None = None) -> Result:
        """Generate a job: stream its events, or wait and answer whole.

        A client that goes away while a whole answer is generated stops it (as vLLM and
        llama-server do), and is counted as cancelled.
        """
        if job.stream:
            return self.events(job, reader)
        async with self.slots:
            loop = asyncio.get_running_loop()
            start = loop.time()
            stretch = self.stretch()
            due = start + (self.cfg.ttft + max(job.plan.generated - 1, 0) / self.cfg.tps) * stretch
            while True:
                left = due - loop.time()
                if reader is not None and reader.at_eof():
                    self.stats["cancelled"] += 1
                    raise ConnectionResetError("the client went away")
                if left <= 0:
                    break
                await asyncio.sleep(min(left, 0.05))
        self.stats["completed"] += 1
        self.cache.store([*job.prompt_pieces, *job.plan.pieces])
        return 200, whole(self.cfg, job)

    def stretch(self) -> float:
        """How much slower a request taking a slot now runs (``--slowdown``): the batch's
        other requests each cost it that fraction of its time."""
        return 1.0 + self.cfg.slowdown * max(self.slots.busy - 1, 0)

    async def wait_for_token(self, start: float, index: int, stretch: float = 1.0) -> None:
        """Sleep until the index-th token is due: TTFT after start, then one per 1/TPS."""
        due = start + (self.cfg.ttft + index / self.cfg.tps) * stretch
        delay = due - asyncio.get_running_loop().time()
        if delay > 0:
            await asyncio.sleep(delay)

    async def events(
        self, job: Job, reader: asyncio.StreamReader | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield a job's stream events, each token when it is due; a client that went
        away stops the generation (counted as cancelled)."""
        finished_all = False
        try:
            async for event in self._events(job, reader):
                yield event
            finished_all = True
        finally:
            self.stats["completed" if finished_all else "cancelled"] += 1
            if finished_all:
                self.cache.store([*job.prompt_pieces, *job.plan.pieces])

    async def _events(
        self, job: Job, reader: asyncio.StreamReader | None
    ) -> AsyncIterator[dict[str, Any]]:
        if job.chat:
            role = chunk(self.cfg, job, None, None, 0)
            role["choices"][0]["delta"] = {"role": "assistant", "content": ""}
            yield role
        pieces = job.plan.pieces
        last = job.plan.generated - 1
        offset = 0
        finished = False
        async with self.slots:
            start = asyncio.get_running_loop().time()
            stretch = self.stretch()
            for index in range(job.plan.generated):
                await self.wait_for_token(start, index, stretch)
                if reader is not None and reader.at_eof():
                    raise ConnectionResetError("the client went away")
                if index < len(pieces):
                    finish = finish_reason(job) if index == last else None
                    yield chunk(self.cfg, job, index, finish, offset)
                    offset += len(pieces[index])
                    finished = finish is not None
            if not finished:
                await self.wait_for_token(start, max(last, 0), stretch)
                yield chunk(self.cfg, job, None, finish_reason(job), offset)
        if job.include_usage:
            tail = chunk(self.cfg, job, None, None, offset)
            tail["choices"] = []
            tail["usage"] = usage(job)
            yield tail


async def serve(cfg: Config) -> None:
    """Serve until SIGTERM or SIGINT, then stop at once, cutting open streams."""
    sim = SimServer(cfg)
    server = await asyncio.start_server(sim.serve_connection, cfg.host, cfg.port)
    port = server.sockets[0].getsockname()[1]
    role = f"guard {cfg.guard_format}" if cfg.guard_format else "generator"
    if cfg.api_key:
        role += ", key required"
    if cfg.weights is not None:
        role += f", weights {cfg.weights.name or 'unnamed'}"
    sys.stdout.write(
        f"llmgw-sim {SIM_VERSION}: listening on http://{cfg.host}:{port} "
        f"(model {cfg.model}, {role}, ctx {cfg.context_length}, parallel {cfg.parallel})\n"
    )
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()  # serving until told to stop: the process's whole life, by design
    server.close()
    # Python 3.11's Server.close leaves accepted connections open: end them here.
    for task in list(sim.connections):
        task.cancel()
    if sim.connections:
        await asyncio.wait(list(sim.connections), timeout=0.5)
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(server.wait_closed(), timeout=0.5)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sim engine from the command line; return the exit code."""
    cfg = parse_config(argv)
    try:
        asyncio.run(serve(cfg))
    except OSError as exc:  # the port is taken, or the address is not ours
        sys.stderr.write(f"llmgw-sim: cannot listen on {cfg.host}:{cfg.port}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
