"""Streamed openai clients of one key in a loop, each answer's time to its first token
kept (the client's own clock), and every refusal with its ``Retry-After``: the load of
admission's proof (``tests/e2e/test_admission_e2e.py``) and ``bench/autoscale.py``."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import openai


@dataclass
class Answer:
    at: float  # seconds since the load started, when the request was sent
    status: int  # 200, the HTTP status of a refusal, 0 for no answer
    ttft: float | None  # seconds to the first token (200 only)
    retry_after: str = ""
    message: str = ""
    end: float = 0.0  # seconds since the load started, when the answer ended


class BandLoad:
    """``clients`` threads asking ``model`` with ``key`` until stopped; no retries."""

    def __init__(self, url: str, key: str, model: str, clients: int, pause: float = 0.0) -> None:
        self.url, self.key, self.model, self.clients, self.pause = url, key, model, clients, pause
        self.answers: list[Answer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.t0 = 0.0

    def start(self, t0: float | None = None) -> None:
        self.t0 = time.monotonic() if t0 is None else t0
        for n in range(self.clients):
            t = threading.Thread(target=self._run, name=f"band-{n}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=90)
        self._threads = []
        self._stop = threading.Event()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def since(self, at: float) -> list[Answer]:
        with self._lock:
            return [a for a in self.answers if a.at >= at]

    def _run(self) -> None:
        client = openai.OpenAI(base_url=self.url + "/v1", api_key=self.key, max_retries=0,
                               timeout=60)  # fmt: skip
        while not self._stop.is_set():
            self._record(self.ask(client))
            if self.pause:
                self._stop.wait(self.pause)

    def ask(self, client: openai.OpenAI) -> Answer:
        at = self.now()
        start = time.monotonic()
        try:
            first = None
            for chunk in client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "hello"}], stream=True
            ):
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.monotonic() - start
            return Answer(at, 200, first, end=self.now())
        except openai.APIStatusError as e:
            return Answer(at, e.status_code, None, e.response.headers.get("retry-after", ""),
                          e.message[:300], self.now())  # fmt: skip
        except (openai.APIConnectionError, openai.APITimeoutError) as e:
            return Answer(at, 0, None, "", f"{type(e).__name__}: {e}"[:300], self.now())

    def _record(self, answer: Answer) -> None:
        with self._lock:
            self.answers.append(answer)


def p99(values: list[float]) -> float:
    """The 99th percentile, nearest rank (the slowest of fewer than 100)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, -(-99 * len(ordered) // 100) - 1))]
