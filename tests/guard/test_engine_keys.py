"""The guard's client carries a judge replica's engine key on every call to it.

Against a real sim judge started with a key: asked with the key it judges, asked
without it (or with another) it gives no verdict, through the thread's pool, an httpx
client and the event loop's pool alike; the check's snapshot of judges holds each
replica's key and never shows it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cluster.enginekeys import engine_key
from cluster.models import Replica
from guard import client, pool, snapshots
from tests.guard.test_client import launch, stop

KEY = "llmgw_engine_guard-test-key"
HARMFUL = "UNSAFE-MARKER how do I hurt someone"


@pytest.fixture(scope="module")
def keyed_judge() -> Iterator[str]:
    proc, url = launch(
        "--model", "qwen3guard-0.6b", "--guard-format", "qwen3guard", "--api-key", KEY
    )
    yield url
    stop(proc)


def ask(url: str, text: str, http: Any, key: str) -> client.JudgeAnswer:
    return client.ask_judge(url, "qwen3guard", text, context_length=8192, client=http, key=key)


@pytest.mark.parametrize("make", [pool.Pool, httpx.Client], ids=["pool", "httpx"])
def test_a_judge_replica_judges_only_for_its_key(keyed_judge: str, make: Any) -> None:
    http = make()
    try:
        assert ask(keyed_judge, "How do I list files?", http, KEY).verdict == "safe"
        assert ask(keyed_judge, HARMFUL, http, KEY).verdict == "unsafe"
        # The tokenizer's calls too: a long text is fitted with the engine's own count.
        assert ask(keyed_judge, "word " * 3000, http, KEY).verdict == "safe"
        for wrong in ("", "llmgw_engine_other"):
            with pytest.raises(client.JudgeFailure) as failed:
                ask(keyed_judge, "How do I list files?", http, wrong)
            assert failed.value.kind == client.HTTP_ERROR and failed.value.status == 401
    finally:
        http.close()


def test_the_loops_pool_carries_the_key_too(keyed_judge: str) -> None:
    async def both() -> tuple[Any, Any]:
        conns = pool.AsyncPool()
        try:
            good = await client.ask_judge_on_loop(
                keyed_judge, "qwen3guard", HARMFUL, context_length=8192, conns=conns, key=KEY
            )
            try:
                await client.ask_judge_on_loop(
                    keyed_judge, "qwen3guard", HARMFUL, context_length=8192, conns=conns
                )
            except client.JudgeFailure as failure:
                return good, failure
            return good, None
        finally:
            conns.close()

    good, failure = asyncio.run(both())
    assert good is not None and good.verdict == "unsafe"
    assert failure is not None and failure.status == 401


@pytest.mark.django_db
def test_the_checks_judges_hold_their_replicas_keys_and_never_show_them() -> None:
    from tests.guard.test_guard_api import judge

    judge("qwen3guard-0.6b", "http://10.0.0.7:9")
    replica = Replica.objects.get(model_name="qwen3guard-0.6b")
    (judge,) = snapshots.judges(["qwen3guard-0.6b"])
    assert judge.endpoint == "http://10.0.0.7:9"
    assert judge.key == engine_key(replica.pk)
    assert judge.key not in repr(judge)
