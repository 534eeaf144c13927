"""A key's scope holds on every hop: a canary or fallback the key
could not name itself is skipped, through the real gateway with the ``openai`` client.
Before, a key that may not use external models reached an external provider through a
fallback, the console's chat did the same, and a key listing only ``fb-a`` got another
model's answer through ``fb-a``'s fallback."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from catalog import spec
from gateway.path.table import Key, digest
from gateway.session import PATH, SessionChat
from tests.gateway.harness import KEY, Harness, model


@pytest.fixture
def h() -> Iterator[Harness]:
    harness = Harness()
    yield harness
    harness.close()


@pytest.fixture(autouse=True)
def listed_providers(settings: Any) -> list[str]:
    """The host:port pairs a plain http:// provider may be at: each stand-in's, as made."""
    settings.LLMGW_EXTERNAL_HTTP_HOSTS = []
    return settings.LLMGW_EXTERNAL_HTTP_HOSTS


def listed(provider: Any) -> str:
    """List a stand-in provider's host:port for plain http:// (this test's settings)."""
    from django.conf import settings

    settings.LLMGW_EXTERNAL_HTTP_HOSTS.append(provider.url.split("//", 1)[1].split("/")[0])
    return provider.url


def scoped(h: Harness, *models: str) -> None:
    h.keys[digest(KEY)] = Key(1, "harness", "team:t", tuple(models), None)


def ask(h: Harness, name: str) -> str:
    client = openai.OpenAI(base_url=h.url + "/v1", api_key=KEY, max_retries=0, timeout=10)
    answer = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "the prompt"}])  # fmt: skip
    return answer.choices[0].message.content or ""


def external(name: str, provider: Any) -> spec.Model:
    return model(name, external=spec.External(url=listed(provider) + "/v1", model="gpt-x"))


def test_a_key_without_external_models_never_reaches_a_provider_through_a_fallback(
    h: Harness,
) -> None:
    provider = h.engine("provider")
    h.unplaced = {"m": "no node has the cards"}
    # The default key: every cluster model, no external one.
    h.serve([model("m", fallbacks=["cloud"]), external("cloud", provider)], [])
    with pytest.raises(openai.APIStatusError) as caught:
        ask(h, "m")
    assert caught.value.status_code == 503 and "no room" in caught.value.message
    assert provider.requests == 0
    # Named by the key, the same fallback is taken.
    scoped(h, "m", "cloud")
    h.refresh()
    assert ask(h, "m").startswith("provider0")
    assert provider.bodies[-1]["messages"][0]["content"] == "the prompt"


def test_a_key_listing_one_model_gets_no_answer_from_its_fallbacks(h: Harness) -> None:
    down, other = h.engine("down", behaviour="503"), h.engine("other")
    h.serve([model("fb-a", fallbacks=["other-alias"]), model("other", aliases=["other-alias"])],
            [(1, "fb-a", down), (2, "other", other)])  # fmt: skip
    scoped(h, "fb-a")
    h.refresh()
    with pytest.raises(openai.APIStatusError) as caught:
        ask(h, "fb-a")
    assert caught.value.status_code == 502 and "HTTP 503" in caught.value.message
    assert other.requests == 0
    # A key that lists the fallback, by its alias, is served by it.
    scoped(h, "fb-a", "other-alias")
    h.refresh()
    assert ask(h, "fb-a").startswith("other0")


def test_a_canary_the_key_may_not_name_gets_none_of_its_requests(h: Harness) -> None:
    stable, candidate = h.engine("stable"), h.engine("candidate")
    h.serve([model("m", canary=spec.Canary(model="cand", percent=100)), model("cand")],
            [(1, "m", stable), (2, "cand", candidate)])  # fmt: skip
    scoped(h, "m")
    h.refresh()
    assert all(ask(h, "m").startswith("stable0") for _ in range(3))
    assert candidate.requests == 0
    scoped(h, "m", "cand")
    h.refresh()
    assert ask(h, "m").startswith("candidate0")


def test_a_judge_named_as_a_fallback_is_never_reached(h: Harness) -> None:
    down, judge = h.engine("down", behaviour="503"), h.engine("judge")
    h.serve([model("m", fallbacks=["judge"]),
             model("judge", role="guard", guard=spec.GuardModel(format="qwen3guard"))],
            [(1, "m", down), (2, "judge", judge)])  # fmt: skip
    scoped(h, "m", "judge")
    h.refresh()
    with pytest.raises(openai.APIStatusError):
        ask(h, "m")
    assert judge.requests == 0


@pytest.mark.django_db(transaction=True)
def test_the_console_chat_never_reaches_an_external_fallback(h: Harness, viewer: Any) -> None:
    from django.conf import settings
    from django.test import Client

    provider = h.engine("provider")
    h.unplaced = {"m": "no node has the cards"}
    h.app = SessionChat(h.gateway, h.gateway)
    h.serve([model("m", fallbacks=["cloud"]), external("cloud", provider)], [])
    browser = Client()
    browser.force_login(viewer)
    secret = "a" * 32  # a CSRF secret as the cookie holds it; the page sends it back
    cookies = {settings.SESSION_COOKIE_NAME: browser.cookies[settings.SESSION_COOKIE_NAME].value,
               settings.CSRF_COOKIE_NAME: secret}  # fmt: skip
    answer = httpx.post(h.url + PATH, cookies=cookies, timeout=10,
                        headers={"X-CSRFToken": secret},
                        json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})  # fmt: skip
    assert answer.status_code == 503, answer.text
    assert provider.requests == 0
