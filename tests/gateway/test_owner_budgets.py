"""Token budgets per owner, shared by all the owner's keys and exact
across gateway processes: reserved up front in Redis by one script, settled with the real
count when the answer ends. Two real processes reserving at once against the real Redis
never let through more than the budget plus one request's reservation, and the count in
Redis is exactly what they spent; through the gateway, two keys of one owner share it."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis

from gateway.path.limits import WINDOW, LocalLimits
from gateway.path.table import Key, digest
from llmgw_core import rediskeys
from tests.dburl import database_url
from tests.gateway.harness import Harness, model
from tests.redisserver import url as redis_url

URL = redis_url(15)
ROOT = Path(__file__).resolve().parents[2]
BUDGET = 2000
MOST = 60  # the largest reservation a worker makes

WORKER = """
import asyncio, json, random, sys
from gateway.path.limits import RedisLimits

url, owner, budget, most, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rng = random.Random(seed)

async def main():
    limits = RedisLimits(url, clock=lambda: 1_000_000.0, timeout=2.0)
    spent, refused = 0, 0

    async def one():
        nonlocal spent, refused
        amount = rng.randint(1, most)
        wait, window = await limits.reserve(owner, amount, budget)
        if wait is not None:
            refused += 1
            return
        await asyncio.sleep(rng.random() / 100)
        used = rng.randint(amount // 2, amount)  # the answer took less than its bound
        spent += used
        await limits.settle(owner, window, amount, used)

    for _ in range(12):
        await asyncio.gather(*(one() for _ in range(10)))
    assert limits.away_since is None, "Redis went away during the test"
    print(json.dumps({"spent": spent, "refused": refused}))

asyncio.run(main())
"""


def test_two_processes_never_pass_the_owners_budget_by_more_than_one_reservation() -> None:
    owner = f"team:t{secrets.token_hex(4)}"
    # Two processes of this cluster: its database, so its part of Redis (llmgw_core.rediskeys).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLMGW_DATABASE_URL": database_url()}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, URL, owner, str(BUDGET), str(MOST), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )  # fmt: skip
        for seed in (1, 2)
    ]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    spent = sum(r["spent"] for r in results)
    assert all(r["refused"] for r in results), results  # both were turned away at the end
    assert spent <= BUDGET + MOST
    assert spent > BUDGET - 2 * MOST  # the budget was used, not refused early
    # Exact: Redis holds what the two processes spent, settled.
    window = int(1_000_000.0 // WINDOW)
    stored = redis.Redis.from_url(URL).get(
        f"{rediskeys.prefix()}gateway:owner:{owner}:tokens:{window}"
    )
    assert int(stored) == spent


def test_the_local_fallback_reserves_and_settles_the_same_way() -> None:
    limits = LocalLimits(clock=lambda: 600.0)

    async def go() -> list[object]:
        first = await limits.reserve("team:a", 80, 100)
        second = await limits.reserve("team:a", 30, 100)  # 110 > 100: refused
        await limits.settle("team:a", first[1], 80, 50)  # gave 30 back
        third = await limits.reserve("team:a", 30, 100)
        other = await limits.reserve("team:b", 100, 100)
        return [first[0], second[0], third[0], other[0]]

    assert asyncio.run(go()) == [None, 60.0, None, None]


A = "llmgw-ck-owner-a-key"
B = "llmgw-ck-owner-b-key"


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    harness.keys[digest(A)] = Key(2, "a", "team:shared", (), None, owner_tpm=200)
    harness.keys[digest(B)] = Key(3, "b", "team:shared", (), None, owner_tpm=200)
    yield harness
    harness.close()


def test_two_keys_of_one_owner_share_its_budget_through_the_gateway(h: Harness) -> None:
    h.serve([model("m")], [(1, "m", h.engine("e"))])

    def ask(secret: str) -> None:
        openai.OpenAI(
            base_url=h.url + "/v1", api_key=secret, max_retries=0
        ).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=10
        )

    served = 0
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(40):
            ask(A)  # 44 reserved (its prompt by its bytes, 10 for the answer)
            served += 1
            ask(B)
            served += 1
    # Each settled with its usage, far under its 44: more than 200 // 44 went through.
    assert served > 200 // 44
    assert "team:shared, shared by its keys (200 tokens a minute)" in str(caught.value)
    assert caught.value.response.headers["retry-after"]
    with pytest.raises(openai.BadRequestError) as whole:
        openai.OpenAI(base_url=h.url + "/v1", api_key=A, max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=300
        )
    assert "more than the budget of team:shared" in str(whole.value)


@pytest.mark.django_db
def test_the_owners_budget_set_on_its_quota_reaches_each_of_its_keys() -> None:
    import io

    from django.core.management import call_command

    from gateway.records.state import load_table

    call_command("cluster", "quota", "set", "team:shared", "--tpm", "5000", stdout=io.StringIO())
    for name, owner in (("a", "team:shared"), ("b", "team:shared"), ("c", "team:other")):
        call_command("gateway", "key", "create", name, "--owner", owner, stdout=io.StringIO())
    keys = {k.name: k.owner_tpm for k in load_table().keys.values()}
    assert keys == {"a": 5000, "b": 5000, "c": 0}
