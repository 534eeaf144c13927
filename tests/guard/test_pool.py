"""guard.pool: the kept-alive connections a check asks its judges through.

Against real servers on real sockets: the sim engine, and small servers written here
for the behaviours an engine may show (closing an idle connection without saying so,
never answering, answering something that is not HTTP, chunked answers). The thread's
pool (``Pool``) and the event loop's (``AsyncPool``, through ``llmgw_core.upstream``) alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from guard import client, formats, pool
from tests.guard.test_client import launch, stop
from tests.waiting import wait_until


@pytest.fixture(scope="module")
def sim_url() -> Iterator[str]:
    proc, url = launch("--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard")
    yield url
    stop(proc)


class Server:
    """A TCP server on 127.0.0.1 that hands each connection to ``serve`` in a thread,
    and counts the connections it accepted."""

    def __init__(self, serve: Callable[[socket.socket], None]) -> None:
        self.serve = serve
        self.accepted = 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)
            thread = threading.Thread(target=self._run, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _run(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            self.serve(conn)

    def all_closed(self) -> bool:
        """Whether every connection accepted has been closed by this end."""
        return all(conn.fileno() == -1 for conn in self.conns)

    def close(self) -> None:
        """Stop accepting and end every connection, then wait for the server's threads (a
        close alone wakes neither a thread in ``accept`` nor one in ``recv``: shut down)."""
        for sock in (self.sock, *self.conns):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self.threads:
            thread.join(timeout=5)


def read_request(conn: socket.socket) -> bytes | None:
    """Read one request (head and Content-Length body); None when the client closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        body += conn.recv(65536)
    return head + b"\r\n\r\n" + body


def answer(body: bytes, extra: bytes = b"", status: bytes = b"200 OK") -> bytes:
    return (
        b"HTTP/1.1 "
        + status
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n"
        + extra
        + b"\r\n"
        + body
    )


def answering(status: bytes, body: bytes, seen: list[bytes] | None = None) -> Server:
    """A server answering every request on a connection with ``status`` and ``body``,
    noting each request in ``seen``."""

    def serve(conn: socket.socket) -> None:
        while (request := read_request(conn)) is not None:
            if seen is not None:
                seen.append(request)
            conn.sendall(answer(body, status=status))

    return Server(serve)


def one_per_connection(servers: list[Server]) -> Server:
    """A server answering one request per connection, then closing it without saying so
    (as an engine's idle timeout does between two checks)."""

    def serve(conn: socket.socket) -> None:
        if read_request(conn) is not None:
            conn.sendall(answer(b'{"ok": true}'))
        conn.close()

    server = Server(serve)
    servers.append(server)
    return server


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for s in made:
        s.close()


def test_a_judge_is_asked_through_the_pool_and_its_connection_kept(sim_url: str) -> None:
    conns = pool.Pool()
    first = client.ask_judge(
        sim_url, "qwen3guard", "How do I list files?", context_length=8192, client=conns
    )
    second = client.ask_judge(
        sim_url, "qwen3guard", "How do I list files?", context_length=8192, client=conns
    )
    assert first.verdict == second.verdict == formats.SAFE
    assert first.score is not None  # the sim engine gives logprobs; they were read
    assert sum(len(c) for c in conns._idle.values()) == 1
    conns.close()
    assert not conns._idle


def test_one_connection_serves_call_after_call(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        while (request := read_request(conn)) is not None:
            conn.sendall(answer(b'{"seen": %d}' % len(request)))

    server = Server(serve)
    servers.append(server)
    conns = pool.Pool()
    for _ in range(5):
        reply = conns.post(server.url + "/v1/completions", json={"prompt": "x"}, timeout=5)
        assert reply.status_code == 200 and reply.json()["seen"] > 0
    assert server.accepted == 1


def test_a_connection_the_engine_closed_while_idle_is_replaced(servers: list[Server]) -> None:
    server = one_per_connection(servers)
    conns = pool.Pool()
    for _ in range(3):
        assert conns.post(server.url + "/x", json={}, timeout=5).json() == {"ok": True}
        # The engine has closed the connection before the next call.
        wait_until(server.all_closed, what="the engine to close its connection")
    assert server.accepted == 3


def test_an_engine_that_says_close_is_not_kept(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        if read_request(conn) is not None:
            conn.sendall(answer(b"{}", b"Connection: close\r\n"))
        conn.close()

    server = Server(serve)
    servers.append(server)
    conns = pool.Pool()
    conns.post(server.url + "/x", json={}, timeout=5)
    assert not any(conns._idle.values())


def test_a_chunked_answer_is_read_whole(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        while read_request(conn) is not None:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
                b'5\r\n{"a":\r\n3\r\n 1}\r\n0\r\n\r\n'
            )

    server = Server(serve)
    servers.append(server)
    conns = pool.Pool()
    assert conns.post(server.url + "/x", json={}, timeout=5).json() == {"a": 1}
    assert conns.post(server.url + "/x", json={}, timeout=5).json() == {"a": 1}
    assert server.accepted == 1


def test_an_engine_that_never_answers_times_out(servers: list[Server]) -> None:
    quiet = threading.Event()
    server = Server(lambda conn: quiet.wait(10))
    servers.append(server)
    # Timeout, not the closed connection the server's handler would leave after 10 s.
    with pytest.raises(pool.Timeout, match="no answer"):
        pool.Pool().post(server.url + "/x", json={}, timeout=0.3)
    quiet.set()


def test_a_refused_connection_is_unreachable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        with pytest.raises(pool.Unreachable, match=f"127.0.0.1:{port}"):
            pool.Pool().post(f"http://127.0.0.1:{port}/x", json={}, timeout=2)


def test_an_answer_that_is_not_http_is_unreachable(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    server = Server(serve)
    servers.append(server)
    with pytest.raises(pool.Unreachable):
        pool.Pool().post(server.url + "/x", json={}, timeout=2)


@pytest.mark.parametrize("url", ["ftp://h/x", "http:///x", "http://h:99999/x", "judge:8080"])
def test_a_url_that_is_not_http_is_unreachable(url: str) -> None:
    with pytest.raises(pool.Unreachable, match="is not an http"):
        pool.Pool().post(url, json={}, timeout=1)


def test_judge_failures_through_the_pool_keep_their_kinds(servers: list[Server]) -> None:
    quiet = threading.Event()
    server = Server(lambda conn: quiet.wait(10))
    servers.append(server)
    with pytest.raises(client.JudgeFailure) as timed_out:
        client.ask_judge(server.url, "qwen3guard", "hi", context_length=8192, timeout=0.3)
    assert timed_out.value.kind == client.TIMEOUT
    quiet.set()

    loading = answering(b"503 Service Unavailable", b'{"error": {"message": "loading model"}}')
    servers.append(loading)
    with pytest.raises(client.JudgeFailure) as refused:
        client.ask_judge(loading.url, "qwen3guard", "hi", context_length=8192)
    assert refused.value.kind == client.HTTP_ERROR and refused.value.status == 503
    assert "loading model" in refused.value.body
    with pytest.raises(client.JudgeFailure) as bad:
        client.ask_judge("judge-without-scheme", "qwen3guard", "hi", context_length=8192)
    assert bad.value.kind == client.REFUSED and "cannot be reached" in bad.value.message


# The event loop's pool: the same behaviours, on one loop.


def on_loop(url: str, times: int = 1, timeout: float = 5) -> list[pool.Reply]:
    """POST ``times`` times through one AsyncPool on one event loop."""

    async def go() -> list[pool.Reply]:
        conns = pool.AsyncPool()
        try:
            return [await conns.post(url, json={"n": i}, timeout=timeout) for i in range(times)]
        finally:
            conns.close()

    return asyncio.run(go())


def test_the_loops_pool_keeps_one_connection_for_call_after_call(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        while (request := read_request(conn)) is not None:
            conn.sendall(answer(b'{"seen": %d}' % len(request)))

    server = Server(serve)
    servers.append(server)
    replies = on_loop(server.url + "/v1/completions", times=5)
    assert [r.status_code for r in replies] == [200] * 5 and replies[0].json()["seen"] > 0
    assert server.accepted == 1


def test_the_loops_pool_replaces_a_connection_closed_while_idle(servers: list[Server]) -> None:
    server = one_per_connection(servers)

    async def go() -> list[Any]:
        conns = pool.AsyncPool()
        out = []
        for _ in range(3):
            out.append((await conns.post(server.url + "/x", json={}, timeout=5)).json())
            await asyncio.to_thread(
                wait_until, server.all_closed, what="the engine to close its connection"
            )
        return out

    assert asyncio.run(go()) == [{"ok": True}] * 3
    assert server.accepted == 3


def test_the_loops_pool_reads_chunked_and_unsized_answers(servers: list[Server]) -> None:
    def chunked(conn: socket.socket) -> None:
        while read_request(conn) is not None:
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b'5;ext=1\r\n{"a":\r\n3\r\n 1}\r\n0\r\nX-Trailer: t\r\n\r\n'
            )

    def unsized(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"b": 2}')
        conn.close()

    one, two = Server(chunked), Server(unsized)
    servers.extend((one, two))
    assert [r.json() for r in on_loop(one.url + "/x", times=2)] == [{"a": 1}] * 2
    assert one.accepted == 1
    assert [r.json() for r in on_loop(two.url + "/x", times=2)] == [{"b": 2}] * 2
    assert two.accepted == 2  # an answer that ends with its connection is not kept


def test_the_loops_pool_times_out_refuses_and_rejects_what_is_not_http(
    servers: list[Server],
) -> None:
    quiet = threading.Event()
    silent = Server(lambda conn: quiet.wait(10))

    def ssh(conn: socket.socket) -> None:
        read_request(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
        conn.close()

    other = Server(ssh)
    servers.extend((silent, other))
    with pytest.raises(pool.Timeout, match="no answer"):  # before the 10 s handler closes
        on_loop(silent.url + "/x", timeout=0.3)
    quiet.set()
    with pytest.raises(pool.Unreachable, match="answer is not HTTP"):
        on_loop(other.url + "/x")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(pool.Unreachable, match=f"127.0.0.1:{port}"):
            on_loop(f"http://127.0.0.1:{port}/x")
    with pytest.raises(pool.Unreachable, match="is not an http"):
        on_loop("judge:8080")


def test_a_judge_asked_on_the_loop_answers_as_when_asked_on_a_thread(sim_url: str) -> None:
    async def go() -> Any:
        return await client.ask_judge_on_loop(
            sim_url, "qwen3guard", "How do I list files?", context_length=8192,
            conns=pool.AsyncPool(),
        )  # fmt: skip

    on_loop_answer = asyncio.run(go())
    threaded = client.ask_judge(sim_url, "qwen3guard", "How do I list files?", context_length=8192)
    assert on_loop_answer is not None
    assert (on_loop_answer.verdict, on_loop_answer.categories, on_loop_answer.score) == (
        threaded.verdict,
        threaded.categories,
        threaded.score,
    )
    assert on_loop_answer.prompt_tokens == threaded.prompt_tokens


def test_a_text_only_the_engine_can_count_is_not_asked_on_the_loop(servers: list[Server]) -> None:
    def serve(conn: socket.socket) -> None:
        while read_request(conn) is not None:
            conn.sendall(answer(b"{}"))

    server = Server(serve)
    servers.append(server)

    async def go() -> Any:
        return await client.ask_judge_on_loop(
            server.url, "qwen3guard", "word " * 5000, context_length=2048,
            conns=pool.AsyncPool(),
        )  # fmt: skip

    assert asyncio.run(go()) is None
    assert server.accepted == 0  # nothing was sent: ask_judge fits it with /tokenize
