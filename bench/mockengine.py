"""A fast mock engine for the gateway's benchmark: answers at once, as little work as can be.

    python bench/mockengine.py PORT

``POST /v1/chat/completions`` answers a fixed completion; with ``"stream": true`` it
streams ``events`` chunks (the body's ``max_tokens``, default 10), then usage and
``[DONE]``. ``POST /v1/responses`` and ``/v1/messages`` answer a fixed response object
and message whole, as an engine serving those APIs natively does (vLLM). HTTP/1.1 keep-alive, uvloop, an asyncio Protocol: no framework, so what the
benchmark measures is the gateway, not this.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys

WHOLE = json.dumps({
    "id": "mock", "object": "chat.completion", "created": 1, "model": "bench",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}).encode()  # fmt: skip
WHOLE_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(WHOLE)
    + WHOLE
)
CHUNK = b'data: {"id":"mock","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{"content":"tok "},"finish_reason":null}]}\n\n'
END = (
    b'data: {"id":"mock","object":"chat.completion.chunk","created":1,"model":"bench","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
    b'data: {"id":"mock","object":"chat.completion.chunk","created":1,"model":"bench","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
    b"data: [DONE]\n\n"
)


def _whole(value: dict) -> bytes:
    data = json.dumps(value).encode()
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % len(data) + data)  # fmt: skip


NATIVE = {
    b"/v1/responses": _whole({
        "id": "resp_mock", "object": "response", "created_at": 1, "status": "completed",
        "model": "bench", "output": [{"type": "message", "id": "msg_mock", "role": "assistant",
                                      "status": "completed",
                                      "content": [{"type": "output_text", "text": "ok"}]}],
        "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens": 1, "total_tokens": 6},
    }),
    b"/v1/messages": _whole({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": "bench",
        "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 5, "output_tokens": 1,
                                         "cache_read_input_tokens": 0},
    }),
}  # fmt: skip
MAX_TOKENS = re.compile(rb'"max_tokens":\s*(\d+)')


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


class Engine(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            native = NATIVE.get(head.split(b" ", 2)[1])
            if native is not None:
                self.transport.write(native)
            elif b'"stream": true' in body or b'"stream":true' in body:
                found = MAX_TOKENS.search(body)
                events = int(found.group(1)) if found else 10
                out = [b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                       b"Transfer-Encoding: chunked\r\n\r\n"]  # fmt: skip
                out.extend(_chunk(CHUNK) for _ in range(events))
                out.append(_chunk(END) + b"0\r\n\r\n")
                self.transport.write(b"".join(out))
            else:
                self.transport.write(WHOLE_RESPONSE)


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Engine, "127.0.0.1", port, backlog=1024)
    print(f"mock engine listening on http://127.0.0.1:{port}", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(main(int(sys.argv[1])))
